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


def recording_batch_size(step_function):
    """Wraps a model's `train_step` (or `test_step`) so the optimizer weighs this replica's
    gradients by its batch size (`weighed_batch_size`), which `kdist.exchange.empty_shares`
    reads too."""
    return _recording(step_function, weighs=True)


def recording_examples(step_function):
    """`recording_batch_size` for `kdist.exchange.empty_shares` alone: the gradients keep Keras's
    equal weights."""
    return _recording(step_function, weighs=False)


def _recording(step_function, weighs: bool):
    @functools.wraps(step_function)
    def step(data):
        _local.batch_size, _local.weighs = batch_size_of(data), weighs
        try:
            return step_function(data)
        finally:
            _local.batch_size = None

    return step


def recorded_batch_size():
    """This replica's examples in the `train_step` or `test_step` running now; None outside one
    (a custom training loop calling the optimizer itself)."""
    return getattr(_local, "batch_size", None)


def weighed_batch_size():
    """`recorded_batch_size()` where the gradients are weighed by it, else None."""
    return recorded_batch_size() if getattr(_local, "weighs", False) else None


def batch_size_of(data):
    """Examples in a (x, y, sample_weight) batch: the first dimension of its first tensor (a
    constant where the batch's shape holds it)."""
    import tensorflow as tf

    first = tf.nest.flatten(data)[0]
    if first.shape.rank and first.shape[0] is not None:
        return tf.constant(first.shape[0], tf.int64)
    return tf.shape(first, out_type=tf.int64)[0]


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

    batch_size = weighed_batch_size()
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
