"""ParameterServerStrategy: asynchronous training coordinated by the chief, variables on ps tasks."""

from kdist.strategies.options import StrategyOptions

OPTIONS = frozenset({"variable_partitioner", "ps_evaluation", "ps_shard_input"})


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    if cluster.task_type != "chief":
        raise RuntimeError(
            f"task {cluster.task}: ParameterServerStrategy is created on the chief only; ps and "
            "worker tasks serve variables and steps (kdist.scope() runs kdist.serve() there)")
    return tf.distribute.experimental.ParameterServerStrategy(
        cluster.resolver(), variable_partitioner=options.variable_partitioner)


def is_parameter_server(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
