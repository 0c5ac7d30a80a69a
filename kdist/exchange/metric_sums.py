"""`sums_over_ring(ring, variables, replicas)`: what reading each SyncOnRead variable across the
replicas gives (its sum, or its mean, over every replica of every worker), in one collective of
the TCP ring for them all.

Reading a metric's variable at an epoch's end is, under MultiWorkerMirrored, one eager TensorFlow
collective between the workers per variable (a Mean metric has two), and each such collective
leaves about 2 KB of TensorFlow's memory behind for the life of the process (measured by hand:
2,000 reads of a SyncOnRead variable on 2 workers, 2.1 KB a read eagerly, 1.6 KB traced; the
growth shows in benchmarks/soak.py). Where kdist's TCP ring sums the
gradients, each worker adds up its own replicas' copies and the ring sums those, every variable
at once. Every worker calls it at the same point of its program, as any collective.

>>> import tensorflow as tf
>>> with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
...     total = tf.Variable(3.0, synchronization=tf.VariableSynchronization.ON_READ,
...                         aggregation=tf.VariableAggregation.SUM)
>>> summable(total), summable(tf.Variable(3.0))
(True, False)
"""

from __future__ import annotations

READ_AS = ("SUM", "MEAN")  # the aggregations whose cross-replica read is a sum or a mean


def summable(variable) -> bool:
    """Whether `variable` is a SyncOnRead variable whose cross-replica read is a sum or a mean
    (every Keras metric's), which `sums_over_ring` can read."""
    import tensorflow as tf

    return (isinstance(variable, tf.distribute.DistributedValues)
            and variable.synchronization == tf.VariableSynchronization.ON_READ
            and variable.aggregation.name in READ_AS)


def sums_over_ring(ring, variables: list, replicas: int) -> list:
    """The cross-replica value of each `summable` variable (NumPy, in its dtype, its shape):
    this worker's copies added up in float64, then summed over the workers by `ring` in one
    collective; a MEAN variable's divided by `replicas` (all of them, every worker's)."""
    import numpy as np

    local = [sum(np.asarray(copy.numpy(), "float64") for copy in variable.values)
             for variable in variables]
    flat = np.concatenate([np.reshape(value, -1) for value in local]) if local else \
        np.zeros(0, "float64")
    summed = np.array(ring.all_reduce_sums(flat)[0])  # a copy: the ring reuses its buffers
    values, start = [], 0
    for variable, value in zip(variables, local):
        part = summed[start:start + np.size(value)].reshape(np.shape(value))
        start += np.size(value)
        if variable.aggregation.name == "MEAN":
            part = part / replicas
        values.append(part.astype(variable.dtype.as_numpy_dtype))
    return values
