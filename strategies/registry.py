"""The plan of each strategy kdist built (`StrategyPlan`: its cluster, its options, who sums its
gradients), so that callbacks and Keras hooks never re-read TF_CONFIG nor decide again, and leave
strategies kdist did not build to Keras; and which strategy `kdist.scope()` entered last. Kept in
`kdist.global_state`.

>>> import tensorflow as tf
>>> from kdist.strategies import registry
>>> registry.cluster_of(tf.distribute.get_strategy()) is None    # not built by kdist
True
"""

from __future__ import annotations

from kdist import global_state
from kdist.cluster.spec import ClusterSpec
from kdist.keras_seam import strategy_kinds
from kdist.strategies.options import StrategyOptions
from kdist.strategies.plan import StrategyPlan


def remember(strategy, plan: StrategyPlan) -> None:
    """Records that kdist built `strategy` as `plan` says."""
    global_state.of_strategy(strategy).plan = plan


def plan_of(strategy) -> StrategyPlan | None:
    """The plan kdist built `strategy` by; None for one built by hand (or TF's default)."""
    return None if strategy is None else global_state.of_strategy(strategy).plan


def options_of(strategy) -> StrategyOptions:
    """The options kdist built `strategy` with; the defaults for a strategy built by hand."""
    plan = plan_of(strategy)
    return plan.options if plan is not None else StrategyOptions()


def cluster_of(strategy) -> ClusterSpec | None:
    """The cluster `strategy` runs on: the spec kdist built it for; for a multi-worker or
    parameter-server strategy built by hand, the cluster its own resolver describes; else None."""
    plan = plan_of(strategy)
    if plan is not None:
        return plan.spec
    return None if strategy is None else strategy_kinds.cluster_from_resolver(strategy)


def make_current(strategy) -> None:
    """`strategy` is the one `kdist.scope()` entered last (`current`)."""
    global_state.process().current = strategy


def current():
    """The strategy of the most recent `kdist.scope()`/`kdist.strategy()`, else TensorFlow's
    current strategy."""
    import tensorflow as tf

    strategy = global_state.process().current
    return strategy if strategy is not None else tf.distribute.get_strategy()


def current_built():
    """The strategy `kdist.scope()`/`kdist.strategy()` entered last; None before any."""
    return global_state.process().current
