"""Local device helpers."""

from __future__ import annotations

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
