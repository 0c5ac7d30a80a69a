"""MultiWorkerMirroredStrategy: synchronous data parallelism across worker processes (collectives)."""

from kdist.strategies.options import StrategyOptions

OPTIONS = frozenset({"all_reduce", "bytes_per_pack", "collective_timeout", "dead_peer_timeout"})

ORDERING_RULE = (
    "MultiWorkerMirroredStrategy must be created before any other TensorFlow operation runs in "
    "this process (TF configures its collective runtime once, at start-up). Enter kdist.scope() "
    "(or call kdist.strategy()) at the top of your script, before building datasets, tensors or "
    "models.")


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=cluster.resolver(),
            communication_options=options.communication_options())
    except RuntimeError as err:
        if "at program startup" in str(err):
            raise RuntimeError(ORDERING_RULE) from err
        raise
    # TF's health-check thread reads these on every round; its first round waits for the cluster.
    for name, value in health_check_settings(options.dead_peer_timeout).items():
        if not hasattr(strategy.extended, name):  # renamed upstream: setattr would do nothing
            raise RuntimeError(f"dead_peer_timeout: this TensorFlow ({tf.__version__}) has no "
                               f"{type(strategy.extended).__name__}.{name}; kdist cannot tune its "
                               "peer health check. Report it to kdist with your TF version")
        setattr(strategy.extended, name, value)
    return strategy


def is_multi_worker(strategy) -> bool:
    """True for a MultiWorkerMirroredStrategy that spans several processes."""
    import tensorflow as tf

    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())


def health_check_settings(dead_peer_timeout: float) -> dict:
    """TF's peer health check tuned so that a dead peer is detected within `dead_peer_timeout`.

    TF (2.16-2.21: every 30 s, 10 s per ping, 3 tries) pings every peer every `interval` seconds,
    each ping waiting `timeout` seconds, and aborts every collective after `retries` failed pings
    in a row: worst case interval + retries x timeout <= 2/3 of the bound, the rest left for the
    error to reach the user's code.
    """
    return {"_check_health_interval": dead_peer_timeout / 3,
            "_check_health_timeout": max(1, int(dead_peer_timeout / 9)),
            "_check_health_retry_limit": 3}
