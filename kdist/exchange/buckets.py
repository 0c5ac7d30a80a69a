"""Gradient buckets: all-reduce in reverse layer order, one collective per bucket, so that the
communication of the last layers' gradients runs while earlier layers still back-propagate.

Keras all-reduces every gradient in one batch, packed in variable order (first layer first), while
backprop produces the last layer's gradient first: no byte can leave before the whole backward pass
is done, and a step costs t1 + t2. With ``kdist.scope(bucket_bytes=n)`` the gradients are grouped,
last variable first, into buckets of about n bytes, and each bucket is summed by its own
collective, which depends on that bucket's gradients only. TensorFlow's executor starts a
collective as soon as its inputs exist; the strategy's ordering token keeps the collectives in the
order they were issued, which is the order their gradients become ready (as PyTorch DDP's buckets
and Horovod's tensor fusion do).

>>> buckets([4096, 16, 65536, 40], bucket_bytes=1024)
[[3, 2], [1, 0]]
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("kdist")


def buckets(sizes_in_bytes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Positions of the tensors, last first, in buckets: a bucket closes once it holds at least
    `bucket_bytes`; the last one holds what is left."""
    grouped, current, filled = [], [], 0
    for position in reversed(range(len(sizes_in_bytes))):
        current.append(position)
        filled += sizes_in_bytes[position]
        if filled >= bucket_bytes:
            grouped.append(current)
            current, filled = [], 0
    if current:
        grouped.append(current)
    return grouped


def warn_if_serial() -> None:
    """Logs a warning when TensorFlow runs one op at a time (one inter-op thread): a bucket's
    collective then waits for each backward op to end, nothing overlaps, and every bucket costs a
    collective of its own (slower than one batch on fast links: benchmarks/results/overlap.md)."""
    import tensorflow as tf

    threads = tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count()
    if threads < 2:
        logger.warning(
            "kdist: bucket_bytes with %d inter-op thread: TensorFlow runs one op at a time, so a "
            "bucket's all-reduce cannot run beside the backward pass and the buckets only add "
            "collectives. Use 2 or more (tf.config.threading.set_inter_op_parallelism_threads; "
            "TensorFlow's default is one per core), or drop bucket_bytes", threads)
