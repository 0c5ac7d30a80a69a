"""MultiWorkerMirroredStrategy: synchronous data parallelism across worker processes (collectives)."""

from kdist.strategies.options import StrategyOptions

OPTIONS = frozenset({"all_reduce", "bytes_per_pack", "collective_timeout", "dead_peer_timeout",
                     "devices"})

ORDERING_RULE = (
    "MultiWorkerMirroredStrategy must be created before any other TensorFlow operation runs in "
    "this process (TF configures its collective runtime once, at start-up). Enter kdist.scope() "
    "(or call kdist.strategy()) at the top of your script, before building datasets, tensors or "
    "models.")


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    _configure_coordination_service(cluster, options.dead_peer_timeout)
    resolver = cluster.resolver()
    if options.devices is not None:
        gpus = replica_gpus(options.devices)
        resolver.num_accelerators = lambda *args, **kwargs: {"GPU": gpus}  # what MWMS counts
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=options.communication_options())
    except RuntimeError as err:
        if "at program startup" in str(err):
            raise RuntimeError(ORDERING_RULE) from err
        raise


def replica_gpus(devices) -> int:
    """How many GPUs each worker replicates over, from `devices=`: MultiWorkerMirrored takes
    GPU:0..k-1 (or the CPU when there are none), so `devices` names exactly those. With
    ``["/gpu:0"]`` each worker runs one replica and the other GPUs stay free for model-parallel
    layers (kdist's hybrid mode).

    >>> replica_gpus(["/gpu:0", "/gpu:1"]), replica_gpus(["/cpu:0"])
    (2, 0)
    """
    from kdist.strategies.options import _canonical

    names = [_canonical(d) for d in devices]
    if names == ["CPU:0"]:
        return 0
    if names != [f"GPU:{i}" for i in range(len(names))]:
        raise ValueError(f"devices={list(devices)!r}: under MultiWorkerMirrored each worker "
                         "replicates over its first k GPUs; give ['/gpu:0', ..., '/gpu:k-1'] "
                         "(['/gpu:0']: one replica per worker, the other GPUs free for "
                         "model-parallel layers) or ['/cpu:0']")
    return len(names)


def _configure_coordination_service(cluster, dead_peer_timeout: float) -> None:
    """Configures TF's coordination service as MultiWorkerMirroredStrategy would, plus a heartbeat
    timeout derived from `dead_peer_timeout`.

    In TF 2.16-2.21 MWMS turns its Python peer health check off whenever the coordination service
    runs (the default), and detects a dead or hung peer by the service's heartbeat alone (10 s by
    default). MWMS configures the service only when nobody has, so kdist configures it first.
    """
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    config_pb2 = _coordination_config_module()
    runtime = context.context()
    if runtime.coordination_service is not None or cluster.task_type not in ("chief", "worker"):
        return
    cluster_spec = cluster.resolver().cluster_spec()
    jobs = [config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    runtime.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=int(heartbeat_timeout(dead_peer_timeout) * 1000))


# Where TensorFlow keeps the coordination service's config proto: under tensorflow/compiler/xla/tsl
# in TF 2.19-2.21, under tensorflow/tsl in TF 2.17 (both checked by the version matrix).
_COORDINATION_CONFIG_MODULES = ("tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2",
                                "tensorflow.tsl.protobuf.coordination_config_pb2")


def _coordination_config_module():
    import importlib

    for name in _COORDINATION_CONFIG_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    import tensorflow as tf  # moved again upstream: say so rather than silently not tuning

    raise RuntimeError(f"dead_peer_timeout: kdist cannot find TensorFlow {tf.__version__}'s "
                       f"coordination service config (looked for {', '.join(_COORDINATION_CONFIG_MODULES)})"
                       "; report it to kdist with your TF version")


def is_multi_worker(strategy) -> bool:
    """True for a MultiWorkerMirroredStrategy that spans several processes."""
    import tensorflow as tf

    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())


def heartbeat_timeout(dead_peer_timeout: float) -> float:
    """Seconds without a heartbeat after which the coordination service declares a task dead: 40%
    of the bound, leaving the rest for the error to abort the collectives, reach the user's code
    and end the process (about 3 s on this machine)."""
    return 0.4 * dead_peer_timeout
