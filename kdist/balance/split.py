"""The input side of `balance`: each replica's slice of every global batch.

>>> import tensorflow as tf
>>> split_sizes(tf.constant(10, tf.int64), (0.75, 0.25)).numpy().tolist()
[7, 3]
>>> split_sizes(tf.constant(3, tf.int64), (0.9, 0.1)).numpy().tolist()
[2, 1]
"""

from __future__ import annotations

import itertools

from kdist.exchange.weights import batch_size_of


def split_sizes(batch_size, shares):
    """Examples per replica for a global batch of `batch_size` (an int64 tensor): one each first
    (when there are enough; Keras's loss of an empty batch is not defined), the rest in
    proportion to `shares`, rounded so that the sizes add up to `batch_size`."""
    import tensorflow as tf

    replicas = len(shares)
    base = tf.cast(batch_size >= replicas, tf.int64)
    rest = tf.cast(batch_size - base * replicas, tf.float64)
    cumulative = tf.constant(list(itertools.accumulate(shares))[:-1] + [1.0], tf.float64)
    bounds = tf.cast(tf.round(rest * cumulative), tf.int64)
    return base + bounds - tf.concat([[0], bounds[:-1]], axis=0)


def distribute(dataset, strategy, shares):
    """`dataset` (of global batches) as a distributed dataset whose replica i gets its slice of
    each batch; every worker reads the whole dataset and keeps its replicas' slices."""
    import tensorflow as tf

    local = len(strategy.extended.worker_devices)

    def dataset_fn(context):
        first = context.input_pipeline_id * local
        slices = dataset.flat_map(lambda *batch: _slices(batch, shares, first, local))
        return slices.prefetch(tf.data.AUTOTUNE)  # as Keras's own input pipelines do

    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def _slices(batch, shares, first: int, count: int):
    """A dataset of the slices of one global batch that replicas first..first+count-1 take."""
    import tensorflow as tf

    batch = batch[0] if len(batch) == 1 else batch
    sizes = split_sizes(batch_size_of(batch), shares)
    starts = tf.concat([[0], tf.cumsum(sizes)[:-1]], axis=0)

    def take(replica):
        start, size = starts[replica], sizes[replica]
        return tf.nest.map_structure(lambda t: t[start:start + size], batch)

    return tf.data.Dataset.range(first, first + count).map(take)
