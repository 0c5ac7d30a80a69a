"""Where a model-parallel shard's variable lives when a strategy creates the layer's variables.

Under the default strategy a variable goes where `tf.device` says. Mirrored strategies ignore that:
they create every variable as a `MirroredVariable` with one copy per replica, on the replicas'
devices. With one replica per process (MultiWorkerMirrored on CPUs or with one GPU per worker,
Mirrored over one device) that puts every shard of a model-parallel layer on the replica's device,
so each worker still holds the whole kernel. `on_device` asks the strategy for a mirrored variable
whose one copy lives on the shard's device instead (TF's own `colocate_with` route, which
optimizer slots already follow), so the storage really is split, and the variable still
takes part in the strategy's checkpoints, updates and initial-value broadcast (one collective
group per device: the shard's own, shared by the same shard on every worker).

With several replicas per process, each replica holds its own copy on its own device: a shard
cannot live elsewhere, and `on_device` is a plain `tf.device`.

Optimizer slots: under a mirrored strategy they follow their variable by the same route. Without
a strategy, Keras builds its optimizer while tracing the train function, where the colocation it
asks for does not reach the eagerly created slot, so every slot lands on the default device;
`install()` makes a slot of a variable on another device live next to it (`keep_slots_with_variables`).

The gradients of such a shard are all-reduced on the shard's device, in that device's group
(`all_reduce_sum`), not copied to the replica's device first: data parallel across the workers,
one collective group per model-parallel rank, as Megatron and Horovod's hybrid setups do.
"""

from __future__ import annotations

import contextlib
import functools

from kdist.keras_compat import registry


class _Devices:
    """What a mirrored strategy's variable creator reads from ``colocate_with``: its devices."""

    def __init__(self, device: str):
        self._devices = (device,)


def replica_device(strategy) -> str | None:
    """The one local replica device of a mirrored `strategy`, or None (several replicas, or a
    strategy that places variables where `tf.device` says)."""
    from tensorflow.python.distribute import mirrored_strategy

    if not isinstance(strategy.extended, mirrored_strategy.MirroredExtended):
        return None
    devices = strategy.extended.worker_devices
    return devices[0] if len(devices) == 1 else None


@contextlib.contextmanager
def on_device(device: str):
    """Variables created in this block live on `device` (see the module docstring)."""
    import tensorflow as tf
    from tensorflow.python.distribute import device_util

    with contextlib.ExitStack() as stack:
        stack.enter_context(tf.device(device))
        if tf.distribute.has_strategy() and replica_device(tf.distribute.get_strategy()):
            target = _Devices(device_util.canonicalize(device))

            def creator(next_creator, **kwargs):
                kwargs["colocate_with"] = target
                return next_creator(**kwargs)

            stack.enter_context(tf.variable_creator_scope(creator))
        yield


def local_logical_devices(kind: str) -> list[str]:
    """This process's logical devices of `kind` ("CPU", "GPU"); in a cluster TensorFlow also lists
    the other tasks' devices, which a layer cannot place its own variables on."""
    import tensorflow as tf
    from tensorflow.python.distribute import device_util

    host = device_util.canonicalize("/cpu:0").rsplit("/device:", 1)[0]
    return [d.name for d in tf.config.list_logical_devices(kind)
            if device_util.canonicalize(d.name).startswith(host + "/")]


def own_group_devices(tensors: list, strategy) -> dict[str, list[int]]:
    """Device -> positions of the `tensors` that live off the one replica device of `strategy`
    (model-parallel shards' gradients), to be all-reduced in their device's own group."""
    from tensorflow.python.distribute import device_util

    replica = replica_device(strategy)
    if replica is None or getattr(strategy.extended, "_num_workers", 1) < 2:
        return {}  # several replicas per process, or one process: nothing to route
    groups: dict[str, list[int]] = {}
    for position, tensor in enumerate(tensors):
        device = device_util.canonicalize(tensor.device) if tensor.device else replica
        if device != replica:
            groups.setdefault(device, []).append(position)
    return groups


_launchers: dict = {}  # (id(strategy), device) -> the device's collective launcher


def all_reduce_sum(tensors: list, device: str, strategy) -> list:
    """Sums `tensors` (all on `device`) over the workers, in `device`'s own collective group: the
    group the strategy broadcast the shards' initial values in (the same device on every worker)."""
    from tensorflow.python.distribute import cross_device_utils

    extended = strategy.extended
    key = (id(strategy), device)
    if key not in _launchers:
        collective_keys = extended._collective_keys
        _launchers[key] = cross_device_utils.CollectiveReplicaLauncher(
            collective_keys.get_group_key([device]), extended._num_workers, collective_keys,
            device, extended._communication_options)
    return _launchers[key].batch_all_reduce([list(tensors)])


def own_groups(strategy) -> list[str]:
    """The devices whose own collective group has summed gradients under `strategy` so far."""
    return sorted(device for (owner, device) in _launchers if owner == id(strategy))


def keep_slots_with_variables(original):
    """Keras's `TFOptimizer.add_variable_from_reference`, under the default strategy on the
    reference variable's device (mirrored strategies place slots there themselves)."""

    @functools.wraps(original)
    def add_variable_from_reference(self, reference_variable, *args, **kwargs):
        import tensorflow as tf

        device = getattr(getattr(reference_variable, "value", reference_variable), "device", "")
        if tf.distribute.has_strategy() or not device:
            return original(self, reference_variable, *args, **kwargs)
        with tf.device(device):
            return original(self, reference_variable, *args, **kwargs)

    return add_variable_from_reference


_installed: list = []


def install() -> None:
    """Installs `keep_slots_with_variables` once (a model-parallel layer's build calls it)."""
    if not _installed:
        from keras.src.backend.tensorflow import optimizer

        _installed.append(registry.replace(optimizer.TFOptimizer, "add_variable_from_reference",
                                           keep_slots_with_variables))


def uninstall() -> None:
    registry.undo(_installed)
    _installed.clear()
