"""This process's devices: split the CPU into several (`split_cpu`), check the devices a strategy
is asked to replicate over (`local_devices`), and name a device one way (`canonical_name`)."""

from __future__ import annotations

from typing import Sequence

from kdist import validators


def split_cpu(count: int) -> list[str]:
    """Splits the host CPU into `count` logical devices; returns their names.

    Must run before TensorFlow initialises its devices (before the first op or strategy), which is
    why it is a separate call: use it at the top of a script to try Mirrored training on a laptop.

    >>> import kdist
    >>> kdist.split_cpu(2)                                  # doctest: +SKIP
    ['/device:CPU:0', '/device:CPU:1']

    It does not start TensorFlow's runtime, so a MultiWorkerMirroredStrategy may follow.
    """
    import tensorflow as tf

    validators.positive_int(count, "count")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError as err:
        current = tf.config.get_logical_device_configuration(cpu)
        if current is None or len(current) != count:
            raise RuntimeError(f"split_cpu({count}) must be called before TensorFlow initialises its "
                               "devices: call it at the top of the script, before any op, dataset, "
                               "model or strategy") from err
    # Named, not listed: listing logical devices would start TF's runtime, after which
    # MultiWorkerMirroredStrategy can no longer be created.
    return [f"/device:CPU:{i}" for i in range(count)]


def local_devices(requested: Sequence[str] | None) -> list[str]:
    """The devices a single-worker strategy replicates over, checked to exist."""
    import tensorflow as tf

    if requested is None:
        gpus = tf.config.list_logical_devices("GPU")
        return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
    known = {canonical_name(d.name) for d in tf.config.list_logical_devices()}
    missing = [d for d in requested if canonical_name(d) not in known]
    if missing:
        raise ValueError(f"devices: {missing[0]!r} does not exist on this machine; the logical devices "
                         f"are {sorted(known)}. Split the CPU with kdist.split_cpu(n) before TF starts, "
                         "or name existing devices")
    return list(requested)


def canonical_name(name: str) -> str:
    """'/cpu:0' and '/job:localhost/replica:0/task:0/device:CPU:0' -> 'CPU:0'."""
    tail = name.split("/")[-1]
    kind, _, index = tail.replace("device:", "").rpartition(":")
    return f"{kind.upper()}:{index}"
