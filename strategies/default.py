"""The default strategy: one process, one device (TensorFlow's default strategy, or one named device)."""

from kdist.devices import local_devices
from kdist.strategies.options import StrategyOptions

OPTIONS = frozenset({"devices"})


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    if options.devices is None:
        return tf.distribute.get_strategy()
    devices = local_devices(options.devices)
    if len(devices) != 1:
        raise ValueError(f"devices={devices}: the default strategy runs on one device; pass one "
                         "device, or use strategy='mirrored' for several")
    return tf.distribute.OneDeviceStrategy(devices[0])
