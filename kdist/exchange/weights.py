"""Gradient weights of unequal replica batches: the update stays the global-batch mean.

Keras scales each replica's loss by 1 / replicas and all-reduces the gradients by sum, which is the
global mean only when the replicas' batches are equal: a last, short batch of 13 rows split 7/6
(or 1/0) weighs the examples of the smaller share more than one device does. With b_i examples on
replica i, kdist sends b_i x replicas x (Keras's gradient) = b_i g_i, and b_i, in the same
all-reduce, and divides the sums: sum_i b_i g_i / sum_i b_i, the one-device gradient of the global
batch. Each replica's b_i is recorded by its `train_step` (`recording_batch_size`), in the
replica's own thread, where tf.distribute traces it. A replica with no examples sends zeros.
"""

from __future__ import annotations

import functools
import threading

_local = threading.local()


def recording_batch_size(train_step):
    """Wraps a model's `train_step` so the optimizer can read this replica's batch size."""

    @functools.wraps(train_step)
    def step(data):
        _local.batch_size = batch_size_of(data)
        try:
            return train_step(data)
        finally:
            _local.batch_size = None

    return step


def recorded_batch_size():
    """This replica's examples in the `train_step` running now; None outside one (a custom
    training loop calling the optimizer itself)."""
    return getattr(_local, "batch_size", None)


def batch_size_of(data):
    """Examples in a (x, y, sample_weight) batch: the first dimension of its first tensor."""
    import tensorflow as tf

    return tf.shape(tf.nest.flatten(data)[0], out_type=tf.int64)[0]


def scaled(gradient, factor):
    """`gradient` (a tensor or `IndexedSlices`) times the scalar `factor`, on the gradient's
    device (a model-parallel shard's gradient stays on its shard's device and is summed in that
    device's group, `kdist.exchange.comm`)."""
    import tensorflow as tf

    with tf.device(gradient.device or None):
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.dtype),
                                    gradient.indices, gradient.dense_shape)
        return gradient * tf.cast(factor, gradient.dtype)


def weigh(gradients: list, replicas: int):
    """This replica's gradients times b_i x replicas, and b_i (as float32) to all-reduce with them
    (b_i: what its `train_step` recorded)."""
    import tensorflow as tf

    batch_size = recorded_batch_size()
    if batch_size is None:
        raise RuntimeError("kdist balance: the optimizer was called outside the model's train_step, "
                           "so this replica's batch size is unknown. Call the optimizer from "
                           "train_step (Keras's own or an override), or drop balance=")
    weighted = [scaled(g, batch_size * replicas) for g in gradients]
    return weighted, tf.cast(batch_size, tf.float32)


def unweigh(summed: list, examples) -> list:
    """The all-reduced weighted gradients divided by the examples of all replicas (none: zeros,
    as every replica's share was empty)."""
    import tensorflow as tf

    share = tf.math.divide_no_nan(1.0, examples)
    return [scaled(g, share) for g in summed]
