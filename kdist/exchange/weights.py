"""Gradient weights of unequal replica batches: the update stays the global-batch mean.

Keras scales each replica's loss by 1 / replicas and all-reduces the gradients by sum, which is the
global mean only when the replicas' batches are equal. With b_i examples on replica i, kdist sends
b_i x replicas x (Keras's gradient) = b_i g_i, and b_i, in the same all-reduce, and divides the sums:
sum_i b_i g_i / sum_i b_i. Each replica's b_i is recorded by its `train_step` (`recording_batch_size`),
in the replica's own thread, where tf.distribute traces it.
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


def batch_size_of(data):
    """Examples in a (x, y, sample_weight) batch: the first dimension of its first tensor."""
    import tensorflow as tf

    return tf.shape(tf.nest.flatten(data)[0], out_type=tf.int64)[0]


def weigh(gradients: list, replicas: int):
    """This replica's gradients times b_i x replicas, and b_i (as float32) to all-reduce with them."""
    import tensorflow as tf

    batch_size = getattr(_local, "batch_size", None)
    if batch_size is None:
        raise RuntimeError("kdist balance: the optimizer was called outside the model's train_step, "
                           "so this replica's batch size is unknown. Call the optimizer from "
                           "train_step (Keras's own or an override), or drop balance=")
    weighted = [g * tf.cast(batch_size * replicas, g.dtype) for g in gradients]
    return weighted, tf.cast(batch_size, tf.float32)


def unweigh(summed: list, examples) -> list:
    """The all-reduced weighted gradients divided by the examples of all replicas."""
    import tensorflow as tf

    return [g / tf.cast(examples, g.dtype) for g in summed]
