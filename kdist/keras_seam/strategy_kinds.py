"""What kind of `tf.distribute` strategy an object is, and the cluster a hand-built one describes.

The seam's fixes ask here, and so do the layers above (`kdist.strategies` re-exports these): the
seam reads nothing above it. Which cluster kdist built a strategy for is the strategies' registry's
to say; the seam reaches it through the hook `Hooks.cluster_of` (`kdist.keras_seam.hooks`).

>>> import tensorflow as tf
>>> from kdist.keras_seam import strategy_kinds
>>> strategy_kinds.is_multi_worker(tf.distribute.get_strategy())
False
>>> strategy_kinds.cluster_from_resolver(tf.distribute.get_strategy()) is None
True
"""

from __future__ import annotations

from kdist.cluster.spec import ClusterSpec
from kdist.keras_seam import tf_internals


def is_multi_worker(strategy) -> bool:
    """True for a MultiWorkerMirroredStrategy that spans several processes."""
    import tensorflow as tf

    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and tf_internals.in_multi_worker_mode(strategy))


def is_parameter_server(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def cluster_from_resolver(strategy) -> ClusterSpec | None:
    """For a multi-worker or parameter-server strategy, the cluster its own resolver describes;
    else None."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not (is_multi_worker(strategy) or is_parameter_server(strategy)):
        return None
    return ClusterSpec(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id,
                       source=f"{type(strategy).__name__}.cluster_resolver")
