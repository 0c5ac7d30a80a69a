"""Where one replica's rows sit in the global batch, for what must be computed as one device
computes it on the whole batch: random draws on the batch (the seam's fix 7,
`kdist.keras_seam.one_device_fixes`) and losses given to `add_loss` that sum over the batch (8).

Every replica's `SeedGenerator` holds the same state, so under N replicas each would draw the
same dropout mask (noise, latent vectors) for its share, where one device draws a different one
for every row of the global batch. The seam draws the rows [o, o + n) of one device's draw,
where this replica's n rows start at row o of the global batch; `draw_offset` says o, and
whether a draw's first dimension is the batch's:

- a symbolic dimension is the batch's when it is computed from the step's input (the graph walk
  of `kdist.exchange.same_rows`): `tf.shape(inputs)[0]`, `ops.shape(images)[0]`;
- a static one when it equals this replica's static share (a batch of known size);
- anything else (a draw of a fixed shape, a weight's noise) stays as Keras draws it.

o is the sum of the shares of the replicas before this one (uneven and empty shares included),
and `global_rows` the sum of all: an all-gather of every replica's batch size, built once per
traced step when something first needs it (a step that needs neither pays no collective). A
batch of static size (a dataset batched with `drop_remainder=True`) is the same on every
replica: o is the replica's index times it, with no collective. The collective is a
synchronization inside the step (`benchmarks/random_draws.py` measures it), so each model that
pays it says so once, with what needs it. A step run eagerly (`run_eagerly=True`, for
debugging) is not tracked: it draws as Keras does.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref

from kdist.exchange import same_rows, weights
from kdist.exchange.comm import Comm, tcp_ring
from kdist.keras_seam import keras_internals

_local = threading.local()
_said: weakref.WeakSet = weakref.WeakSet()  # the models told about their collective
logger = logging.getLogger("kdist")

DRAWS = ("it draws random numbers on the batch (dropout, noise): each of the {replicas} "
         "replicas draws its rows of the draw one device makes for the global batch. To draw "
         "as Keras does instead (the same numbers on every replica, not one device's), run "
         "kdist.keras_seam.patches.patch('random_draws_as_one_device').uninstall() first")
SUMS = ("a loss given to add_loss sums over the batch: each of the {replicas} replicas' sums "
        "weighs as its part of one device's sum of the global batch")


def tracking(step_function):
    """Wraps a model's `train_step` or `test_step`: what it computes on the global batch can ask
    where this replica's rows sit in it (`draw_offset`, `global_rows`)."""
    @functools.wraps(step_function)
    def step(data):
        import tensorflow as tf

        if tf.executing_eagerly():  # run_eagerly=True: Keras's own draws and divisions
            return step_function(data)
        _local.step = _Step(tf.compat.v1.get_default_graph(), step_function)
        try:
            return step_function(data)
        finally:
            _local.step = None

    return step


def draw_offset(first_dimension):
    """The row where this replica's share starts in the global batch (a scalar int64 tensor)
    when `first_dimension` is this replica's share of the batch, in a step `tracking` wraps;
    None otherwise."""
    step = getattr(_local, "step", None)
    if step is None or not step.is_batch(first_dimension):
        return None
    return step.gathered(DRAWS)[0]


def global_rows(needed_for: str):
    """The rows of the global batch (a scalar int64 tensor) in a traced step `tracking` wraps,
    else None; `needed_for` (SUMS, DRAWS) is what the model is told once if it takes a
    collective."""
    step = getattr(_local, "step", None)
    return None if step is None else step.gathered(needed_for)[1]


class _Step:
    """One replica's traced step and, once asked, where its rows sit."""

    def __init__(self, graph, step_function):
        self.graph = graph
        self._gathered = None
        self._step_function = step_function

    @property
    def rows(self):
        """This replica's examples, as the step's `kdist.exchange.weights` wrapper (inside this
        one, on the same methods) recorded them."""
        return weights.recorded_batch_size()

    def is_batch(self, dimension) -> bool:
        import tensorflow as tf

        if isinstance(dimension, tf.Tensor):
            return not same_rows.same_on_every_replica(dimension)
        static = tf.get_static_value(self.rows)
        return static is not None and int(dimension) == int(static)

    def gathered(self, needed_for: str):
        """(the row where this replica's rows start, the rows of the global batch)."""
        if self._gathered is None:
            with self.graph.as_default():  # in the step's graph: a loop's body may ask first
                self._gathered = _placed(self.rows, lambda replicas: self._say(needed_for,
                                                                               replicas))
        return self._gathered

    def _say(self, needed_for: str, replicas: int) -> None:
        owner = keras_internals.model_of(self._step_function)
        if owner in _said:
            return
        _said.add(owner)
        logger.warning(
            "kdist: %s's step takes one all-gather of the replicas' batch sizes (none for a "
            "batch of fixed size: drop_remainder=True), because %s",
            type(owner).__name__, needed_for.format(replicas=replicas))


def _placed(rows, say):
    """(the sum of the batch sizes of the replicas before this one, the sum of all)."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    replica = tf.cast(context.replica_id_in_sync_group, tf.int64)
    replicas = context.num_replicas_in_sync
    static = tf.get_static_value(rows)
    if static is not None:  # every replica's batch has this size
        return replica * int(static), tf.constant(replicas * int(static), tf.int64)
    say(replicas)
    every = Comm(context, step=None, ring=tcp_ring(context.strategy)).all_gather(
        [tf.reshape(tf.cast(rows, tf.int64), [1])])[0]
    before = tf.range(tf.size(every, out_type=tf.int64)) < replica
    return tf.reduce_sum(tf.where(before, every, tf.zeros_like(every))), tf.reduce_sum(every)
