"""MultiWorkerMirroredStrategy: synchronous data parallelism across worker processes (collectives)."""

import atexit
import logging
import threading

from kdist import failure, startup
from kdist.devices import canonical_name
from kdist.keras_seam import tf_internals
from kdist.strategies.options import StrategyOptions

OPTIONS = frozenset({"all_reduce", "bytes_per_pack", "collective_timeout", "dead_peer_timeout",
                     "devices", "startup_timeout"})

ORDERING_RULE = (
    "MultiWorkerMirroredStrategy must be created before any other TensorFlow operation runs in "
    "this process (TF configures its collective runtime once, at start-up). Enter kdist.scope() "
    "(or call kdist.strategy()) at the top of your script, before building datasets, tensors or "
    "models.")


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    _configure_coordination_service(cluster, options.heartbeat_timeout)
    # MWMS replicates over as many GPUs as the resolver counts (every local one by default).
    gpus = None if options.devices is None else replica_gpus(options.devices)
    resolver = cluster.resolver(num_gpus=gpus)

    if tf_internals.runtime_started():  # before waiting for anyone: TF would refuse anyway
        raise RuntimeError(ORDERING_RULE)
    if cluster.task_type in ("chief", "worker"):  # TF waits for them, mutely: kdist first
        startup.wait_for_peers(cluster, startup.startup_timeout(options.startup_timeout),
                               roles=("chief", "worker"),
                               what="the workers of MultiWorkerMirroredStrategy")
    try:
        with startup.signals_kept():
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver,
                communication_options=options.communication_options())
    except RuntimeError as err:
        if "at program startup" in str(err):
            raise RuntimeError(ORDERING_RULE) from err
        raise
    if cluster.task_type in ("chief", "worker") and cluster.num_workers > 1:
        _leave_together_at_exit(f"{cluster.task_type}-{cluster.task_index}",
                                min(options.dead_peer_timeout, LEAVE_TIMEOUT_S))
    if options.all_reduce == "tcp" and len(strategy.extended.worker_devices) > 1:
        raise ValueError(f"all_reduce='tcp' sums one replica per worker, and each worker here has "
                         f"{len(strategy.extended.worker_devices)} (its GPUs): use 'auto' (NCCL "
                         "between GPUs), or devices=['/gpu:0']")
    return strategy


# At most this long a task that ended normally waits at exit for the others (a peer that died is
# found sooner, by the coordination service's heartbeat).
LEAVE_TIMEOUT_S = 30.0
_SAY_AFTER_S = 2.0


def _leave_together_at_exit(task: str, timeout_s: float) -> None:
    """At exit, a task waits for the others to reach their own exit, once per process.

    A collective ends on each task when that task has its result, while a peer may still be
    reading this task's part: a task that exits right after the program's last collective (fit's
    last epoch report, a gather) closes its server under the peer, which then fails on "Socket
    closed" although the training succeeded. The tasks therefore leave together, through the
    coordination service's barrier. A program ending on an exception does not wait (its peers are
    failing or are stopped by the launcher)."""
    atexit.unregister(_leave_together)  # once per process, whatever builds the strategy again
    atexit.register(_leave_together, task, timeout_s)


def _leave_together(task: str, timeout_s: float) -> None:
    if failure.ending_on_exception():
        return
    logger = logging.getLogger("kdist")
    waiting = (f"[kdist] {task}: the program ended; waiting up to {timeout_s:.0f} s for the other "
               "workers to end theirs, so that none loses this worker while it reads its last results")
    said = threading.Timer(_SAY_AFTER_S, logger.info, [waiting])
    said.daemon = True
    said.start()
    try:
        tf_internals.wait_at_job_barrier("kdist_leave_together", timeout_s)
    except Exception as err:  # noqa: BLE001 (the program's work is done; its exit code stays)
        logger.info(f"[kdist] {task}: leaving without the other workers: "
                    f"{str(err).strip().splitlines()[0][:200]}")
    finally:
        said.cancel()


def sums_over_tcp(strategy, options: StrategyOptions) -> bool:
    """Whether kdist's TCP ring (`kdist.exchange.ring`) sums the gradients of `strategy`, which
    kdist built with `options` (decided once, into its `StrategyPlan`): when asked
    (``all_reduce="tcp"``), and by default (``"auto"``) where each worker runs one replica on its
    CPU. There TensorFlow's collectives copy every chunk through gRPC's protobufs, several times the
    ring's time on the same bytes (benchmarks/results/collectives.md). GPUs keep TensorFlow's choice
    (NCCL), and ``all_reduce="ring"`` keeps TensorFlow's collectives on CPUs. Beside the gradients
    only the step's logs ride the ring (`kdist.exchange.scalar_means`); TensorFlow's collectives
    carry the rest (batch-norm statistics, barriers, the input's checks)."""
    if options.all_reduce == "tcp":
        return True
    devices = strategy.extended.worker_devices
    return options.all_reduce == "auto" and len(devices) == 1 and \
        canonical_name(devices[0]).startswith("CPU:")


def replica_gpus(devices) -> int:
    """How many GPUs each worker replicates over, from `devices=`: MultiWorkerMirrored takes
    GPU:0..k-1 (or the CPU when there are none), so `devices` names exactly those. With
    ``["/gpu:0"]`` each worker runs one replica and the other GPUs stay free for model-parallel
    layers (kdist's hybrid mode).

    >>> replica_gpus(["/gpu:0", "/gpu:1"]), replica_gpus(["/cpu:0"])
    (2, 0)
    """
    names = [canonical_name(d) for d in devices]
    if names == ["CPU:0"]:
        return 0
    if names != [f"GPU:{i}" for i in range(len(names))]:
        raise ValueError(f"devices={list(devices)!r}: under MultiWorkerMirrored each worker "
                         "replicates over its first k GPUs; give ['/gpu:0', ..., '/gpu:k-1'] "
                         "(['/gpu:0']: one replica per worker, the other GPUs free for "
                         "model-parallel layers) or ['/cpu:0']")
    return len(names)


def _configure_coordination_service(cluster, heartbeat_timeout: float) -> None:
    """Configures TF's coordination service as MultiWorkerMirroredStrategy would, plus the
    heartbeat timeout (`StrategyOptions.heartbeat_timeout`, a share of dead_peer_timeout).

    In TF 2.16-2.22 MWMS turns its Python peer health check off whenever the coordination service
    runs (the default), and detects a dead or hung peer by the service's heartbeat alone (10 s by
    default). MWMS configures the service only when nobody has, so kdist configures it first.
    """
    if cluster.task_type not in ("chief", "worker"):
        return
    tf_internals.configure_coordination_service(cluster.resolver().cluster_spec(),
                                                heartbeat_timeout)
