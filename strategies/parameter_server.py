"""ParameterServerStrategy: asynchronous training coordinated by the chief, variables on ps tasks."""

from kdist import startup
from kdist.strategies.options import StrategyOptions

OPTIONS = frozenset({"variable_partitioner", "ps_evaluation", "ps_shard_input",
                     "startup_timeout"})


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    if cluster.task_type != "chief":
        raise RuntimeError(
            f"task {cluster.task}: ParameterServerStrategy is created on the chief only; ps and "
            "worker tasks serve variables and steps (kdist.scope() runs kdist.serve() there)")
    # The servers watch the chief's port to know when it ends: the chief does not hold it here.
    startup.wait_for_peers(cluster, startup.startup_timeout(options.startup_timeout),
                           roles=("ps", "worker"), what="the ps and worker tasks",
                           hold_own_port=False)
    with startup.signals_kept():
        return tf.distribute.experimental.ParameterServerStrategy(
            cluster.resolver(), variable_partitioner=options.variable_partitioner)
