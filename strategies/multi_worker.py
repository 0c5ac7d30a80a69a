"""MultiWorkerMirroredStrategy: synchronous data parallelism across worker processes (collectives)."""

from strategies.options import StrategyOptions

OPTIONS = frozenset({"all_reduce", "bytes_per_pack", "collective_timeout"})

ORDERING_RULE = (
    "MultiWorkerMirroredStrategy must be created before any other TensorFlow operation runs in "
    "this process (TF configures its collective runtime once, at start-up). Enter kdist.scope() "
    "(or call kdist.strategy()) at the top of your script, before building datasets, tensors or "
    "models.")


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=cluster.resolver(),
            communication_options=options.communication_options())
    except RuntimeError as err:
        if "at program startup" in str(err):
            raise RuntimeError(ORDERING_RULE) from err
        raise
