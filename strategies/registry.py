"""Which cluster a strategy was built for, so that callbacks and Keras hooks never re-read
TF_CONFIG and leave strategies kdist did not build to Keras.

>>> import tensorflow as tf
>>> from kdist.strategies import registry
>>> registry.cluster_of(tf.distribute.get_strategy()) is None    # not built by kdist
True
"""

from __future__ import annotations

import weakref

from kdist.cluster.spec import ClusterSpec
from kdist.strategies.options import StrategyOptions

_specs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_options: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def remember(strategy, spec: ClusterSpec, options: StrategyOptions) -> None:
    """Records that kdist built `strategy` for `spec` with `options`."""
    _specs[strategy] = spec
    _options[strategy] = options


def options_of(strategy) -> StrategyOptions:
    """The options kdist built `strategy` with; the defaults for a strategy built by hand."""
    return _options.get(strategy, StrategyOptions()) if strategy is not None else StrategyOptions()


def cluster_of(strategy) -> ClusterSpec | None:
    """The cluster `strategy` runs on: the spec kdist built it for; for a multi-worker or
    parameter-server strategy built by hand, the cluster its own resolver describes; else None."""
    if strategy is None:
        return None
    if strategy in _specs:
        return _specs[strategy]
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not _is_multi_process(strategy):
        return None
    return ClusterSpec(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id,
                       source=f"{type(strategy).__name__}.cluster_resolver")


def _is_multi_process(strategy) -> bool:
    from kdist.strategies.multi_worker import is_multi_worker
    from kdist.strategies.parameter_server import is_parameter_server

    return is_multi_worker(strategy) or is_parameter_server(strategy)
