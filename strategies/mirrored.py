"""MirroredStrategy: synchronous data parallelism over the devices of one process."""

from kdist.devices import local_devices
from kdist.strategies.options import StrategyOptions

OPTIONS = frozenset({"devices", "all_reduce"})


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    if options.all_reduce in ("ring", "tcp"):
        raise ValueError(f"all_reduce={options.all_reduce!r} is not available to MirroredStrategy "
                         "(one process); use 'auto' or 'nccl' ('ring' and 'tcp' apply to "
                         "multi-worker)")
    # "auto": TF's choice, NCCL between GPUs and reduction to one device otherwise.
    cross_device_ops = tf.distribute.NcclAllReduce() if options.all_reduce == "nccl" else None
    return tf.distribute.MirroredStrategy(local_devices(options.devices),
                                          cross_device_ops=cross_device_ops)
