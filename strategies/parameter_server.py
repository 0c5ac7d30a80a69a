"""ParameterServerStrategy: asynchronous training coordinated by the chief, variables on ps tasks."""

from strategies.options import StrategyOptions

OPTIONS = frozenset({"variable_partitioner"})


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    if cluster.task_type != "chief":
        raise RuntimeError(
            f"task {cluster.task}: ParameterServerStrategy is created on the chief only; ps and "
            "worker tasks serve variables and steps (see kdist issue #3 for the Keras 3 integration)")
    return tf.distribute.experimental.ParameterServerStrategy(
        cluster.resolver(), variable_partitioner=options.variable_partitioner)
