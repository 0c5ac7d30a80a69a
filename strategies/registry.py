"""Which cluster and options a strategy was built for, so that callbacks and Keras hooks never
re-read TF_CONFIG and leave strategies kdist did not build to Keras; and which strategy
`kdist.scope()` entered last. Kept in `kdist.global_state`.

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



def remember(strategy, spec: ClusterSpec, options: StrategyOptions) -> None:
    """Records that kdist built `strategy` for `spec` with `options`."""
    kept = global_state.of_strategy(strategy)
    kept.spec, kept.options = spec, options


def options_of(strategy) -> StrategyOptions:
    """The options kdist built `strategy` with; the defaults for a strategy built by hand."""
    if strategy is None:
        return StrategyOptions()
    options = global_state.of_strategy(strategy).options
    return options if options is not None else StrategyOptions()


def built_by_kdist(strategy) -> bool:
    """Whether kdist built `strategy` (`remember`ed it); TF's default strategy is not recorded."""
    return strategy is not None and global_state.of_strategy(strategy).options is not None


def cluster_of(strategy) -> ClusterSpec | None:
    """The cluster `strategy` runs on: the spec kdist built it for; for a multi-worker or
    parameter-server strategy built by hand, the cluster its own resolver describes; else None."""
    if strategy is None:
        return None
    spec = global_state.of_strategy(strategy).spec
    return spec if spec is not None else strategy_kinds.cluster_from_resolver(strategy)


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
