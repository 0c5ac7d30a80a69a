"""Where compressors meet Keras: optimizer state, the all-reduce, warm-up and statistics.

`kdist.scope(compression=...)` makes a compressor active; `compile()` inside the scope binds it to
the model's optimizer (kdist/keras_compat.py installs the patches). During `apply_gradients`, where
Keras all-reduces the gradients, `all_reduce_sum` sends compressible tensors through the
compressor and the rest as they are. Before `start_step` everything goes uncompressed; a callback
that kdist adds to `fit` re-traces the train function once the step is reached (collectives cannot
sit inside `tf.cond` under MirroredStrategy).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import keras

from kdist.compression.base import Comm, Compressor, NoCompression, _numel

_active = contextvars.ContextVar("kdist_compression", default=(None, 1))


@contextlib.contextmanager
def activated(compressor, aggregate_every: int = 1):
    """Makes `compressor` and `aggregate_every` what `compile()` binds inside this block."""
    if compressor is not None and not isinstance(compressor, Compressor):
        raise TypeError(f"compression={compressor!r}: use a kdist.compression.Compressor, e.g. "
                        "kdist.compression.PowerSGD(rank=4)")
    if isinstance(aggregate_every, bool) or not isinstance(aggregate_every, int) or \
            aggregate_every < 1:
        raise ValueError(f"aggregate_every={aggregate_every!r}: use a positive number of steps")
    token = _active.set((compressor, aggregate_every))
    try:
        yield
    finally:
        _active.reset(token)


def bind_active(model) -> None:
    """Called after `compile()`: binds the active compression to the model's optimizer."""
    compressor, aggregate_every = _active.get()
    if isinstance(compressor, NoCompression):
        compressor = None  # Keras's own all-reduce, bit for bit
    optimizer = model.optimizer
    if compressor is None and aggregate_every == 1:
        return
    if optimizer.gradient_accumulation_steps:
        raise ValueError("kdist.scope(compression/aggregate_every) cannot drive an optimizer with "
                         "gradient_accumulation_steps (Keras puts its all-reduce inside a cond, "
                         "which tf.distribute forbids): use aggregate_every instead")
    if getattr(optimizer, "_kdist_bound", False):
        raise ValueError("this optimizer is already bound by kdist; create a new optimizer (or "
                         "model) per compression setting")
    optimizer._kdist_bound = True
    optimizer._kdist_compression = compressor
    optimizer._kdist_aggregate_every = aggregate_every
    optimizer._kdist_phase = Phase(compress=compressor is not None and compressor.start_step == 0,
                                   accumulate=aggregate_every > 1)


class Phase:
    """What the train function being traced does: compress or not, accumulate or reduce."""

    def __init__(self, compress: bool, accumulate: bool):
        self.compress, self.accumulate = compress, accumulate

    def key(self):
        return self.compress, self.accumulate


def is_bound(model) -> bool:
    optimizer = getattr(model, "optimizer", None)
    return bool(getattr(optimizer, "_kdist_bound", False))


def create_state(optimizer, variables) -> None:
    """Creates per-replica optimizer variables (saved and restored with the optimizer in
    checkpoints): each compressible variable's compressor state, and gradient accumulators when
    aggregate_every > 1."""
    if not getattr(optimizer, "_kdist_bound", False):
        return
    from keras.src import backend

    compressor = optimizer._kdist_compression
    optimizer._kdist_states = {}
    for variable in variables:
        spec = dict(compressor.state_spec(variable.shape)) if compressor is not None and \
            compressor.should_compress(variable.shape) else {}
        if optimizer._kdist_aggregate_every > 1:
            spec["accumulator"] = (tuple(variable.shape), "zeros")
        state = {}
        with backend.name_scope(optimizer.name, caller=optimizer):
            for name, (shape, initializer) in spec.items():
                state[name] = backend.Variable(
                    initializer=keras.initializers.get(initializer), shape=shape,
                    dtype=variable.dtype, trainable=False, aggregation="mean",
                    synchronization="on_read",
                    name=f"{variable.path.replace('/', '_')}_kdist_{name}")
                optimizer._track_variable(state[name])
        optimizer._kdist_states[optimizer._var_key(variable)] = state


def all_reduce_sum(optimizer, grads_and_vars, replica_context):
    """Keras's `_all_reduce_sum_gradients`, with compressible gradients compressed."""
    import tensorflow as tf

    compressor = optimizer._kdist_compression
    pairs = list(grads_and_vars)
    present = [(i, g, v) for i, (g, v) in enumerate(pairs) if g is not None]
    dense = [tf.convert_to_tensor(g) for _, g, _ in present]  # IndexedSlices: densified
    comm = Comm(replica_context, optimizer.iterations)
    chosen = [k for k, (_, _, v) in enumerate(present)
              if optimizer._kdist_phase.compress and compressor.should_compress(v.shape)]
    plain = [k for k in range(len(present)) if k not in chosen]
    summed = dict(zip(plain, comm.all_reduce_sum([dense[k] for k in plain])))
    states = [optimizer._kdist_states[optimizer._var_key(present[k][2])] for k in chosen]
    summed.update(zip(chosen, compressor.aggregate([dense[k] for k in chosen], states, comm)))
    out = list(pairs)
    for k, (i, _, v) in enumerate(present):
        out[i] = (summed[k], v)
    return out


def update_step(optimizer, grads, variables, learning_rate, original):
    """With aggregate_every = k: accumulate locally (no collective, no update) in accumulate
    phases; in the reduce phase all-reduce the mean of the k gradients and apply it."""
    import tensorflow as tf

    every = getattr(optimizer, "_kdist_aggregate_every", 1)
    if every == 1:
        return original(optimizer, grads, variables, learning_rate)
    accumulators = [optimizer._kdist_states[optimizer._var_key(v)]["accumulator"] for v in variables]
    grads = [tf.convert_to_tensor(g) for g in grads]
    if optimizer._kdist_phase.accumulate:
        for accumulator, grad in zip(accumulators, grads):
            accumulator.assign(accumulator.value + grad)
        return None
    mean = [(a.value + g) / every for a, g in zip(accumulators, grads)]
    for accumulator in accumulators:
        accumulator.assign(tf.zeros_like(accumulator.value))
    return original(optimizer, mean, variables, learning_rate)


def accumulating(optimizer) -> bool:
    phase = getattr(optimizer, "_kdist_phase", None)
    return phase is not None and phase.accumulate


def stats(model, compressing: bool = True) -> dict:
    """Nominal bytes one replica sends per optimizer step (a micro-step when aggregate_every > 1)
    once compression has started, and the ratio to plain float32 all-reduce every step
    (collective algorithm and framing not included)."""
    optimizer = getattr(model, "optimizer", None)
    compressor = getattr(optimizer, "_kdist_compression", None) if compressing else None
    every = getattr(optimizer, "_kdist_aggregate_every", 1)
    plain = sum(4 * _numel(v.shape) for v in model.trainable_variables)
    sent = sum(compressor.payload_bytes(v.shape) if compressor is not None
               and compressor.should_compress(v.shape) else 4 * _numel(v.shape)
               for v in model.trainable_variables) / every
    return {"comm_bytes_per_step": sent, "comm_uncompressed_bytes": plain,
            "comm_ratio": plain / sent if sent else math.inf}


class PhaseCallback(keras.callbacks.Callback):
    """Added by kdist to `fit` for a model whose optimizer kdist drives: before each step it picks
    the phase (uncompressed warm-up until `start_step`; accumulate or reduce with aggregate_every)
    and the train function traced for it (traced once per phase; collectives cannot sit inside
    `tf.cond` under tf.distribute), and it puts the byte statistics in the logs."""

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer
        self.compressor = optimizer._kdist_compression
        self.every = optimizer._kdist_aggregate_every
        self._functions = {}
        self._stats = {}

    def on_train_begin(self, logs=None):
        if self.model.steps_per_execution > 1 and self.every > 1:
            raise ValueError("aggregate_every > 1 needs steps_per_execution=1 (the phase changes "
                             "every step)")
        self._functions = {}
        self._select()

    def on_train_batch_begin(self, batch, logs=None):
        if self.every > 1 or not self.optimizer._kdist_phase.compress:
            self._select()

    def on_train_batch_end(self, batch, logs=None):
        self._add_stats(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._add_stats(logs)

    def _select(self):
        step = int(self.optimizer.iterations.numpy())
        compress = self.compressor is not None and step >= self.compressor.start_step
        phase = Phase(compress, self.every > 1 and (step + 1) % self.every != 0)
        self.optimizer._kdist_phase = phase
        if phase.key() not in self._functions:  # traced on first call, under this phase
            self.model.make_train_function(force=True)
            self._functions[phase.key()] = self.model.train_function
        self.model.train_function = self._functions[phase.key()]

    def _add_stats(self, logs):
        if logs is not None:
            compressing = self.optimizer._kdist_phase.compress
            if compressing not in self._stats:
                self._stats[compressing] = stats(self.model, compressing=compressing)
            logs.update(self._stats[compressing])
