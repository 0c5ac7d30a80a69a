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
asks for does not reach the eagerly created slot, so every slot would land on the default device;
kdist's `slots_next_to_variables` hook puts a slot of a variable on another device next to it
(`slot_device`).

The gradients of such a shard are all-reduced on the shard's device, in that device's group
(`kdist.exchange.Comm`), not copied to the replica's device first: data parallel across the
workers, one collective group per model-parallel rank, as Megatron and Horovod's hybrid setups do.
"""

from __future__ import annotations

import contextlib

from kdist.keras_seam import tf_internals


def replica_device(strategy) -> str | None:
    """The one local replica device of a mirrored `strategy`, or None (several replicas, or a
    strategy that places variables where `tf.device` says)."""
    if not tf_internals.is_mirrored(strategy):
        return None
    devices = strategy.extended.worker_devices
    return devices[0] if len(devices) == 1 else None


@contextlib.contextmanager
def on_device(device: str):
    """Variables created in this block live on `device` (see the module docstring)."""
    import tensorflow as tf

    with contextlib.ExitStack() as stack:
        stack.enter_context(tf.device(device))
        if tf.distribute.has_strategy() and replica_device(tf.distribute.get_strategy()):
            target = tf_internals.colocated_with_device(device)

            def creator(next_creator, **kwargs):
                kwargs["colocate_with"] = target
                return next_creator(**kwargs)

            stack.enter_context(tf.variable_creator_scope(creator))
        yield


def local_logical_devices(kind: str) -> list[str]:
    """This process's logical devices of `kind` ("CPU", "GPU"); in a cluster TensorFlow also lists
    the other tasks' devices, which a layer cannot place its own variables on."""
    import tensorflow as tf

    host = tf_internals.canonical_device("/cpu:0").rsplit("/device:", 1)[0]
    return [d.name for d in tf.config.list_logical_devices(kind)
            if tf_internals.canonical_device(d.name).startswith(host + "/")]


def own_group_devices(tensors: list, strategy) -> dict[str, list[int]]:
    """Device -> positions of the `tensors` that live off the one replica device of `strategy`
    (model-parallel shards' gradients), to be all-reduced in their device's own group."""
    replica = replica_device(strategy)
    if replica is None or tf_internals.num_workers(strategy) < 2:
        return {}  # several replicas per process, or one process: nothing to route
    groups: dict[str, list[int]] = {}
    for position, tensor in enumerate(tensors):
        device = tf_internals.canonical_device(tensor.device) if tensor.device else replica
        if device != replica:
            groups.setdefault(device, []).append(position)
    return groups


def own_groups(strategy) -> list[str]:
    """The devices whose own collective group has summed gradients under `strategy` so far."""
    return tf_internals.device_groups_used(strategy)


def slot_device(reference_variable) -> str | None:
    """Where a new optimizer slot of `reference_variable` goes without a strategy: next to the
    variable when it has a device (a model-parallel shard); None under a strategy, which places
    slots itself, or for a variable with no device."""
    import tensorflow as tf

    device = getattr(getattr(reference_variable, "value", reference_variable), "device", "")
    if tf.distribute.has_strategy() or not device:
        return None
    return device
