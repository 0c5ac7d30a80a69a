"""Every TensorFlow internal kdist uses (`tensorflow.python`, private attributes), in one place.

Each function says what it reads and why no public API serves. The version matrix (`.ci/stacks`)
runs them on every supported TensorFlow.

>>> import tensorflow as tf
>>> canonical_device("/cpu:0")
'/job:localhost/replica:0/task:0/device:CPU:0'
"""

from __future__ import annotations

import contextlib
import importlib

from kdist import global_state


# ------------------------------------------------------------------ the eager runtime
def runtime_started() -> bool:
    """Whether TensorFlow's eager runtime is initialised (its C context exists). No public API
    tells without initialising it."""
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None


def run_before_first_op(callback) -> None:
    """Calls `callback()` once, right before TensorFlow initialises its runtime (its first op),
    after any device configuration the program made. MultiWorkerMirroredStrategy must be built
    there; TensorFlow has no public start-up hook, so this wraps the context's
    `ensure_initialized` once (an instance attribute, removed again on first use)."""
    from tensorflow.python.eager import context

    runtime = context.context()
    if runtime._context_handle is not None:
        return
    initialise = runtime.ensure_initialized

    def callback_then_initialise():
        del runtime.ensure_initialized  # one shot: TF's own method from now on
        callback()
        initialise()

    runtime.ensure_initialized = callback_then_initialise


# ------------------------------------------------------------------ the coordination service
# Where TensorFlow keeps the coordination service's config proto: under tensorflow/compiler/xla/tsl
# in TF 2.19-2.22, under tensorflow/tsl in TF 2.17 (both checked by the version matrix).
_COORDINATION_CONFIG_MODULES = ("tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2",
                                "xla.tsl.protobuf.coordination_config_pb2",
                                "tensorflow.tsl.protobuf.coordination_config_pb2")


def _coordination_config_module():
    for name in _COORDINATION_CONFIG_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    import tensorflow as tf  # moved again upstream: say so rather than silently not tuning

    raise RuntimeError(f"dead_peer_timeout: kdist cannot find TensorFlow {tf.__version__}'s "
                       f"coordination service config (looked for "
                       f"{', '.join(_COORDINATION_CONFIG_MODULES)}); report it to kdist with your "
                       "TF version")


def configure_coordination_service(cluster_spec, heartbeat_timeout_s: float) -> None:
    """Configures TF's coordination service as MultiWorkerMirroredStrategy would (leader, the
    chief and worker jobs), with `heartbeat_timeout_s`; does nothing when it is already set up.
    MWMS configures the service only when nobody has, without a way to pass the timeout."""
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    config_pb2 = _coordination_config_module()
    runtime = context.context()
    if runtime.coordination_service is not None:
        return
    jobs = [config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    runtime.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(heartbeat_timeout_s * 1000))


def set_job_key(key: str, value: str) -> None:
    """Writes `key` in the coordination service's key-value store (shared by the job's tasks);
    raises if another task wrote it first."""
    from tensorflow.python.eager import context

    context.context().set_config_key_value(key, value)


def replace_job_key(key: str, value: str) -> None:
    """Sets `key` in the coordination service's key-value store, replacing its value."""
    from tensorflow.python.eager import context

    try:
        context.context().delete_config_key_value(key)
    except Exception:  # noqa: BLE001 (not there yet)
        pass
    context.context().set_config_key_value(key, value)


def get_job_key(key: str, timeout_ms: int | None = None) -> str:
    """Reads `key` from the coordination service, waiting up to `timeout_ms` (None: forever)."""
    from tensorflow.python.eager import context

    if timeout_ms is None:
        return context.context().get_config_key_value(key)
    return context.context().get_config_key_value(key, timeout_ms)


def peek_job_key(key: str) -> str | None:
    """`key`'s value in the coordination service's store, or None if it is not there now (or the
    service does not answer: its task died), without waiting for it."""
    from tensorflow.python.eager import context

    try:
        return context.context().get_config_key_value(key, PEEK_MS)
    except Exception:  # noqa: BLE001 (not there, or the service is gone: both mean none)
        return None


def wait_at_job_barrier(barrier_id: str, timeout_s: float) -> None:
    """Returns once every task of the coordination service has called it with `barrier_id`;
    raises when `timeout_s` passes first or a task is found dead."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(barrier_id, int(timeout_s * 1000))


PEEK_MS = 50  # a key already written is returned at once; an absent one costs this wait


# ------------------------------------------------------------------ strategies and devices
def in_multi_worker_mode(strategy) -> bool:
    """Whether a MultiWorkerMirroredStrategy spans several processes (its extended's private
    test: a one-worker MWMS is a local strategy)."""
    return strategy.extended._in_multi_worker_mode()


def num_workers(strategy) -> int:
    """The worker processes of a multi-worker strategy's collectives (1 for a local one)."""
    return getattr(strategy.extended, "_num_workers", 1)


def replicas_per_worker(strategy) -> int:
    """The replicas each worker process of `strategy` runs (at least 1)."""
    return max(1, strategy.num_replicas_in_sync // max(1, num_workers(strategy)))


def is_mirrored(strategy) -> bool:
    """Whether `strategy` creates mirrored variables (Mirrored and MultiWorkerMirrored)."""
    from tensorflow.python.distribute import mirrored_strategy

    return isinstance(strategy.extended, mirrored_strategy.MirroredExtended)


def one_replica_spec(element_spec):
    """The spec of one replica's batch, from a distributed dataset's `element_spec` (a
    `PerReplicaSpec` per tensor where a worker holds several replicas). No public API opens a
    `PerReplicaSpec`."""
    import tensorflow as tf
    from tensorflow.python.distribute import values

    return tf.nest.map_structure(
        lambda spec: spec._value_specs[0] if isinstance(spec, values.PerReplicaSpec) else spec,
        element_spec)


def canonical_device(name: str) -> str:
    """A device name in TensorFlow's full form ('/cpu:0' -> '/job:.../device:CPU:0')."""
    from tensorflow.python.distribute import device_util

    return device_util.canonicalize(name)


class _Devices:
    """What a mirrored strategy's variable creator reads from ``colocate_with``: its devices."""

    def __init__(self, device: str):
        self._devices = (device,)


def colocated_with_device(device: str):
    """A value for a variable creator's ``colocate_with`` that makes a mirrored strategy create
    the variable with its one copy on `device` (TF's own route for optimizer slots)."""
    return _Devices(canonical_device(device))


def device_group_all_reduce(tensors: list, device: str, strategy) -> list:
    """Sums `tensors` (on `device`) over the workers of a multi-worker strategy, in `device`'s
    own collective group: the group the strategy broadcast that device's variables' initial
    values in (the same device on every worker). tf.distribute reduces only on the replica's
    devices; its `CollectiveReplicaLauncher` does it on any device."""
    from tensorflow.python.distribute import cross_device_utils

    extended = strategy.extended
    launchers = global_state.of_strategy(strategy).launchers  # device -> its launcher
    if device not in launchers:
        collective_keys = extended._collective_keys
        launchers[device] = cross_device_utils.CollectiveReplicaLauncher(
            collective_keys.get_group_key([device]), extended._num_workers, collective_keys,
            device, extended._communication_options)
    return launchers[device].batch_all_reduce([list(tensors)])


def device_groups_used(strategy) -> list[str]:
    """The devices whose own collective group has summed tensors under `strategy` so far."""
    return sorted(global_state.of_strategy(strategy).launchers)


def is_sharded_variable(value) -> bool:
    """Whether a variable is a `ShardedVariable` (from `variable_partitioner`), which has no
    public type."""
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    return isinstance(value, ShardedVariable)


def skip_remote_function_removal() -> None:
    """From now on, a traced function's finalizer no longer asks the runtime to remove it from
    every task it ran on (the eager context's `remove_function`, replaced on this context only:
    functions can still be traced and run)."""
    from tensorflow.python.eager import context

    context.context().remove_function = lambda name: None


@contextlib.contextmanager
def executor_scope(executor):
    """TensorFlow's `context.executor_scope`: eager ops of this thread run on `executor` in the
    block; afterwards on the executor the thread had, restored without waiting for its pending
    nodes (TensorFlow's own wraps it in a Python `Executor`, whose finaliser waits for them).
    Through the C API (`pywrap_tfe`): the Python wrapper always waits."""
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context

    runtime = context.context()
    runtime.ensure_initialized()
    handle = runtime._context_handle
    previous = pywrap_tfe.TFE_ContextGetExecutorForThread(handle)  # a new handle, not owning it
    try:
        runtime.executor = executor
        yield
    finally:
        pywrap_tfe.TFE_ContextSetExecutorForThread(handle, previous)
        pywrap_tfe.TFE_DeleteExecutor(previous)  # the handle only


# ------------------------------------------------------------------ tf.data
def ending_together(distributed_dataset):
    """`distributed_dataset` (from `distribute_datasets_from_function`), read without TensorFlow's
    agreement, at every step, on whether any replica still has data: under MultiWorkerMirrored a
    dataset not known to be infinite is read with partial-batch handling (`get_next`, and
    `get_next_as_optional`, which Keras reads, always), whose every step all-reduces across
    workers how many replicas got a batch (about 2 ms of a 4.5 ms step on 2 workers here).
    Only for pipelines that yield, on every worker, one element per replica for each global
    batch (an empty share is an element): all run out at the same step, each with its own
    OutOfRange, which Keras takes as the data's end. No public option turns the agreement off
    for one dataset; TensorFlow skips it where the private `_cardinality` it keeps is infinite
    (and `_enable_get_next_as_optional` is False), which this sets."""
    import tensorflow as tf

    distributed_dataset._cardinality = tf.data.INFINITE_CARDINALITY
    distributed_dataset._enable_get_next_as_optional = False
    return distributed_dataset


def batch_size_upstream(dataset) -> int | None:
    """The batch size of the `batch` step of a dataset pipeline (`.batch(n).map(...).prefetch()`),
    walking up through its input datasets; None when there is none. tf.data has no public
    accessor: a batch without `drop_remainder` leaves the element spec's first dimension None, and
    the size is only in the private `_batch_size` of the batch dataset, `_input_dataset` its
    parent."""
    import tensorflow as tf

    while dataset is not None:
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            return int(tf.get_static_value(size))
        dataset = getattr(dataset, "_input_dataset", None)
    return None
