"""Random draws as one device: each replica draws its own rows of the draw one device makes for
the global batch.

Every replica's `SeedGenerator` holds the same state, so under N replicas each draws the same
dropout mask (noise, latent vectors) for its share, where one device draws a different one for
every row of the global batch. The seam's fix (`kdist.keras_seam.one_device_fixes`, 7) draws the
rows [o, o + n) of one device's draw, where this replica's n rows start at row o of the global
batch; `draw_offset` says o, and whether a draw's first dimension is the batch's:

- a symbolic dimension is the batch's when it is computed from the step's input (the graph walk
  of `kdist.exchange.same_rows`): `tf.shape(inputs)[0]`, `ops.shape(images)[0]`;
- a static one when it equals this replica's static share (a batch of known size);
- anything else (a draw of a fixed shape, a weight's noise) stays as Keras draws it.

o is the sum of the shares of the replicas before this one (uneven and empty shares included):
an all-gather of every replica's batch size, built once per traced step at its first draw that
needs it (a step that draws nothing on the batch pays no collective). A batch of static size (a
dataset batched with `drop_remainder=True`) is the same on every replica: o is the replica's
index times it, with no collective. The collective is a synchronization in the middle of the
forward pass (`benchmarks/random_draws.py` measures it), so each model that pays it says so
once, with the way back to Keras's draws.
"""

from __future__ import annotations

import functools
import logging
import threading

from kdist.exchange import same_rows, weights
from kdist.exchange.comm import Comm, tcp_ring
from kdist.keras_seam import keras_internals

_local = threading.local()
logger = logging.getLogger("kdist")


def offsetting(step_function):
    """Wraps a model's `train_step`: its random draws on the batch take this replica's rows of
    one device's draw (`draw_offset`)."""
    said = []

    @functools.wraps(step_function)
    def step(data):
        import tensorflow as tf

        _local.step = _Step(data, tf.compat.v1.get_default_graph(), step_function, said)
        try:
            return step_function(data)
        finally:
            _local.step = None

    return step


def draw_offset(first_dimension):
    """The row where this replica's share starts in the global batch (a scalar int64 tensor)
    when `first_dimension` is this replica's share of the batch, in a step `offsetting` wraps;
    None otherwise."""
    step = getattr(_local, "step", None)
    if step is None or not step.is_batch(first_dimension):
        return None
    return step.offset()


class _Step:
    """One replica's traced step: its batch and, once a draw asks, where its rows start."""

    def __init__(self, data, graph, step_function, said: list):
        self.graph = graph
        with graph.as_default():
            self.rows = weights.batch_size_of(data)
        self._offset = None
        self._step_function, self._said = step_function, said

    def is_batch(self, dimension) -> bool:
        import tensorflow as tf

        if isinstance(dimension, tf.Tensor):
            return not same_rows.same_on_every_replica(dimension)
        static = tf.get_static_value(self.rows)
        return static is not None and int(dimension) == int(static)

    def offset(self):
        if self._offset is None:
            with self.graph.as_default():  # in the step's graph: a loop's body may draw first
                self._offset = _offset_of(self.rows, self._collective_said)
        return self._offset

    def _collective_said(self, replicas: int) -> None:
        if self._said:
            return
        self._said.append(True)
        owner = keras_internals.model_of(self._step_function)
        logger.warning(
            "kdist: %s draws random numbers on the batch (dropout, noise): each of the %d "
            "replicas draws its rows of the draw one device makes for the global batch, which "
            "takes one all-gather of the replicas' batch sizes in every step's forward pass "
            "(none for a batch of fixed size: drop_remainder=True). To draw as Keras does "
            "instead (the same numbers on every replica, not one device's), run "
            "kdist.keras_seam.patches.patch('random_draws_as_one_device').uninstall() first",
            type(owner).__name__ if owner is not None else "the model", replicas)


def _offset_of(rows, collective_said):
    """The sum of the batch sizes of the replicas before this one."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    replica = tf.cast(context.replica_id_in_sync_group, tf.int64)
    static = tf.get_static_value(rows)
    if static is not None:  # every replica's batch has this size
        return replica * int(static)
    collective_said(context.num_replicas_in_sync)
    every = Comm(context, step=None, ring=tcp_ring(context.strategy)).all_gather(
        [tf.reshape(tf.cast(rows, tf.int64), [1])])[0]
    before = tf.range(tf.size(every, out_type=tf.int64)) < replica
    return tf.reduce_sum(tf.where(before, every, tf.zeros_like(every)))
