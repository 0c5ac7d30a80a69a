"""MirroredStrategy: synchronous data parallelism over the devices of one process."""

from strategies.options import StrategyOptions, local_devices

OPTIONS = frozenset({"devices", "all_reduce"})


def build(cluster, options: StrategyOptions):
    import tensorflow as tf

    cross_device_ops = {
        "auto": None,  # TF's choice: NCCL between GPUs, reduction to one device otherwise
        "nccl": tf.distribute.NcclAllReduce(),
    }
    if options.all_reduce not in cross_device_ops:
        raise ValueError(f"all_reduce={options.all_reduce!r} is not available to MirroredStrategy "
                         "(one process); use 'auto' or 'nccl' ('ring' applies to multi-worker)")
    return tf.distribute.MirroredStrategy(local_devices(options.devices),
                                          cross_device_ops=cross_device_ops[options.all_reduce])
