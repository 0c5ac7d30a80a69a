"""`balance="measure"`: each replica's throughput, timed where it trains.

The replicas run side by side as in training (`strategy.run`), each timing its own forward and
backward pass (no collective inside the timed part; the times are all-reduced afterwards, so every
worker gets the same figures). The forward pass runs in inference mode, so measuring changes
nothing in the model (BatchNorm statistics, counters); it costs about what a training pass costs.

The clock is the step clock's reading (`kdist.steps.clock.reading`, which also splits every
step of a MultiWorkerMirrored fit): a `tf.py_function` that takes the batch (start) and every
gradient (end), summed, as inputs: data dependencies, which Grappler keeps. The median over `steps`
timed batches gives examples per second per replica, and the shares follow them.
"""

from __future__ import annotations

import logging

from kdist.exchange import weights
from kdist.steps.clock import reading

logger = logging.getLogger("kdist")


def measure_shares(model, distributed_dataset, steps: int, warmup_steps: int) -> tuple:
    """Shares proportional to each replica's measured throughput on `distributed_dataset`'s first
    batches (split equally, as Keras splits them)."""
    import numpy as np
    import tensorflow as tf

    strategy = model.distribute_strategy
    timed = tf.function(lambda data: strategy.run(_timed_step, args=(model, data)))
    iterator = iter(distributed_dataset)
    seconds, examples = [], []
    for step in range(warmup_steps + steps):
        try:
            result = timed(next(iterator))
        except (StopIteration, tf.errors.OutOfRangeError):
            break
        if step >= warmup_steps:
            time, count = (t.numpy() for t in strategy.experimental_local_results(result)[0])
            seconds.append(time)
            examples.append(count)
    if not seconds:
        raise ValueError(f"balance='measure': the input has fewer than {warmup_steps + 1} batches; "
                         "give more data, or fixed shares (balance=[...])")
    throughput = np.median(np.asarray(examples) / np.maximum(np.asarray(seconds), 1e-9), axis=0)
    shares = tuple(float(s) for s in throughput / throughput.sum())
    logger.info("kdist: balance measured %s examples/s per replica -> shares %s",
                [round(float(t)) for t in throughput], [round(s, 3) for s in shares])
    return shares


def _timed_step(model, data):
    """In one replica: seconds of its forward and backward pass and its examples, as one-hot
    vectors over the replicas, summed over them (every replica gets every replica's figures)."""
    import keras
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    start = reading(data, whole=True)
    data = tf.nest.map_structure(lambda t: _after(t, start), data)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=False)  # no side effects (BatchNorm statistics stay)
        loss = model.compute_loss(x, y, y_pred, sample_weight)
    gradients = tape.gradient(loss, model.trainable_variables)
    seconds = reading(gradients, whole=True) - start
    one_hot = tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=tf.float64)
    examples = tf.cast(weights.batch_size_of(x), tf.float64)
    return context.all_reduce(tf.distribute.ReduceOp.SUM, [one_hot * seconds, one_hot * examples])


def _after(tensor, start):
    """`tensor`, made to depend on `start` by data (+ 0), so nothing reading it runs earlier."""
    import tensorflow as tf

    if not _is_numeric(tensor):
        return tensor
    return tensor + tf.cast(start * 0.0, tensor.dtype)


def _is_numeric(tensor) -> bool:
    return tensor.dtype.is_floating or tensor.dtype.is_integer
