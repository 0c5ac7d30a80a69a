"""Where compressors meet Keras: one `Binding` on the optimizer, and the optimizer patches.

`kdist.scope(compression=..., aggregate_every=k, bucket_bytes=n)` makes a setting active for the
block (`activated`); `compile()` inside it puts a `Binding` on the model's optimizer (``optimizer._kdist``):
the compressor, k, the phase being traced and the per-variable state. The optimizer methods kdist
patches (`install`) only act on optimizers that carry a binding:

- `build` creates the binding's per-replica state (compressor state, accumulators);
- `_all_reduce_sum_gradients`, where Keras all-reduces, sends compressible tensors through the
  compressor and the rest as they are;
- `_backend_update_step` accumulates locally with aggregate_every (Keras's own
  gradient_accumulation_steps puts the all-reduce inside ops.cond, which Mirrored and
  MultiWorkerMirrored reject: "merge_call called while defining a new graph", Keras 3.15 / TF 2.21);
- `_apply_weight_decay` decays once per applied update, not per micro-step.

Before `start_step` everything goes uncompressed; `PhaseCallback` (added to `fit` by
`kdist.fit_dispatch`) re-traces the train function once per phase (collectives cannot sit inside
`tf.cond` under MirroredStrategy).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import keras

from kdist import validators
from kdist.compression import buckets
from kdist.compression.base import Comm, Compressor, NoCompression, _numel
from kdist.keras_compat import internals, registry
from kdist.layers import placement

# What compile() inside `kdist.scope(compression=...)` binds: (compressor, aggregate_every,
# bucket_bytes).
_active = contextvars.ContextVar("kdist_compression", default=(None, 1, None))


@contextlib.contextmanager
def activated(compressor, aggregate_every: int = 1, bucket_bytes: int | None = None):
    """Makes `compressor`, `aggregate_every` and `bucket_bytes` (`kdist.compression.buckets`)
    what `compile()` binds inside this block."""
    if compressor is not None and not isinstance(compressor, Compressor):
        raise TypeError(f"compression={compressor!r}: use a kdist.compression.Compressor, e.g. "
                        "kdist.compression.PowerSGD(rank=4)")
    validators.positive_int(aggregate_every, "aggregate_every")
    if bucket_bytes is not None:
        validators.positive_int(bucket_bytes, "bucket_bytes")
        buckets.warn_if_serial()
    token = _active.set((compressor, aggregate_every, bucket_bytes))
    try:
        yield
    finally:
        _active.reset(token)


class Phase:
    """What the train function being traced does: compress or not (and the compressor's stage),
    accumulate or reduce."""

    def __init__(self, compress: bool, accumulate: bool, stage=None):
        self.compress, self.accumulate, self.stage = compress, accumulate, stage

    def key(self):
        return self.compress, self.accumulate, self.stage


class Binding:
    """kdist's whole state on one optimizer (``optimizer._kdist``)."""

    def __init__(self, optimizer, compressor: Compressor | None, aggregate_every: int,
                 balanced: bool = False, bucket_bytes: int | None = None):
        self.optimizer = optimizer
        self.bucket_bytes = bucket_bytes  # None: one batch, as Keras; else `buckets`
        self.traced_buckets: list = []  # the variables of each bucket, as last traced
        self.compressor = compressor
        self.aggregate_every = aggregate_every
        self.balanced = balanced  # kdist.balance: replicas' gradients weighted by their examples
        self.phase = Phase(compress=compressor is not None and compressor.start_step == 0,
                           accumulate=aggregate_every > 1)
        self.states: dict = {}  # optimizer._var_key(variable) -> {name: per-replica variable}

    @property
    def has_phases(self) -> bool:
        """Whether `fit` needs the `PhaseCallback` (compression or aggregate_every)."""
        return self.compressor is not None or self.aggregate_every > 1

    @property
    def accumulating(self) -> bool:
        return self.phase.accumulate

    def create_state(self, variables) -> None:
        """Per-replica optimizer variables (saved and restored with the optimizer in checkpoints):
        each compressible variable's compressor state, and accumulators when aggregate_every > 1."""
        from keras.src import backend

        optimizer = self.optimizer
        self.states = {}
        for variable in variables:
            spec = dict(self.compressor.state_spec(variable.shape)) if self._compresses(variable) \
                else {}
            if self.aggregate_every > 1:
                spec["accumulator"] = (tuple(variable.shape), "zeros")
            state = {}
            with backend.name_scope(optimizer.name, caller=optimizer), \
                    internals.per_replica_variables("mean"):
                for name, (shape, initializer) in spec.items():
                    state[name] = backend.Variable(
                        initializer=keras.initializers.get(initializer), shape=shape,
                        dtype=variable.dtype, trainable=False, aggregation="mean",
                        name=f"{variable.path.replace('/', '_')}_kdist_{name}")
                    optimizer._track_variable(state[name])
            self.states[optimizer._var_key(variable)] = state

    def _compresses(self, variable) -> bool:
        return self.compressor is not None and self.compressor.should_compress(variable.shape)

    def _state(self, variable) -> dict:
        return self.states[self.optimizer._var_key(variable)]

    def all_reduce_sum(self, grads_and_vars, replica_context):
        """Keras's `_all_reduce_sum_gradients`, with compressible gradients compressed and, with
        `balance`, every gradient weighted by its replica's examples (`kdist.balance.weights`)."""
        import tensorflow as tf

        from kdist.balance import weights

        pairs = list(grads_and_vars)
        present = [(i, g, v) for i, (g, v) in enumerate(pairs) if g is not None]
        dense = [tf.convert_to_tensor(g) for _, g, _ in present]  # IndexedSlices: densified
        comm = Comm(replica_context, self.optimizer.iterations)
        extra = []
        if self.balanced:
            dense, examples = weights.weigh(dense, comm.replicas)
            extra = [examples]  # summed in the same all-reduce as the first plain gradients
        groups = buckets.buckets([t.shape.num_elements() * t.dtype.size for t in dense],
                                 self.bucket_bytes) if self.bucket_bytes \
            else [list(range(len(present)))]
        self.traced_buckets = [[present[k][2].name for k in group] for group in groups]
        summed, examples = {}, None
        for index, group in enumerate(groups):  # one collective (or compressor round) per bucket
            riders = extra if index == 0 else []
            chosen = [k for k in group if self.phase.compress and self._compresses(present[k][2])]
            plain = [k for k in group if k not in chosen]
            reduced = comm.all_reduce_sum([dense[k] for k in plain] + riders)
            summed.update(zip(plain, reduced))
            if riders:
                examples = reduced[-1]
            if chosen:
                states = [self._state(present[k][2]) for k in chosen]
                summed.update(zip(chosen, self.compressor.aggregate([dense[k] for k in chosen],
                                                                    states, comm)))
        if self.balanced:
            summed = dict(zip(summed, weights.unweigh(list(summed.values()), examples)))
        out = list(pairs)
        for k, (i, _, v) in enumerate(present):
            out[i] = (summed[k], v)
        return out

    def update_step(self, grads, variables, learning_rate, original):
        """With aggregate_every = k: accumulate locally (no collective, no update) in accumulate
        phases; in the reduce phase all-reduce the mean of the k gradients and apply it."""
        import tensorflow as tf

        if self.aggregate_every == 1:
            return original(self.optimizer, grads, variables, learning_rate)
        accumulators = [self._state(v)["accumulator"] for v in variables]
        grads = [tf.convert_to_tensor(g) for g in grads]
        if self.phase.accumulate:
            for accumulator, grad in zip(accumulators, grads):
                accumulator.assign(accumulator.value + grad)
            return None
        mean = [(a.value + g) / self.aggregate_every for a, g in zip(accumulators, grads)]
        for accumulator in accumulators:
            accumulator.assign(tf.zeros_like(accumulator.value))
        return original(self.optimizer, mean, variables, learning_rate)


def binding(model_or_optimizer) -> Binding | None:
    """The kdist binding of a model's (or an optimizer's) optimizer, or None."""
    optimizer = getattr(model_or_optimizer, "optimizer", model_or_optimizer)
    return getattr(optimizer, "_kdist", None)


def bind_active(model) -> None:
    """Called after `compile()`: binds the active compression (and the model's `balance`, bound
    just before) to the model's optimizer."""
    from kdist.balance import plan

    compressor, aggregate_every, bucket_bytes = _active.get()
    if isinstance(compressor, NoCompression):
        compressor = None  # Keras's own all-reduce, bit for bit
    optimizer = model.optimizer
    balanced = plan.of(model) is not None
    if balanced and aggregate_every > 1:
        raise ValueError("balance= with aggregate_every > 1: the accumulated micro-batches would "
                         "need weights of their own. Use one of them, or a larger global batch "
                         "instead of aggregate_every")
    if compressor is None and aggregate_every == 1 and not balanced and bucket_bytes is None:
        return
    if optimizer.gradient_accumulation_steps:
        raise ValueError("kdist.scope(compression/aggregate_every) cannot drive an optimizer with "
                         "gradient_accumulation_steps (Keras puts its all-reduce inside a cond, "
                         "which tf.distribute forbids): use aggregate_every instead")
    if binding(optimizer) is not None:
        raise ValueError("this optimizer is already bound by kdist; create a new optimizer (or "
                         "model) per compression setting")
    optimizer._kdist = Binding(optimizer, compressor, aggregate_every, balanced, bucket_bytes)


def stats(model, compressing: bool = True) -> dict:
    """Nominal bytes one replica sends per optimizer step (a micro-step when aggregate_every > 1)
    once compression has started, and the ratio to plain float32 all-reduce every step
    (collective algorithm and framing not included)."""
    bound = binding(model)
    compressor = bound.compressor if bound is not None and compressing else None
    every = bound.aggregate_every if bound is not None else 1
    replicas = model.distribute_strategy.num_replicas_in_sync
    plain = sum(4 * _numel(v.shape) for v in model.trainable_variables)
    sent = sum(compressor.route(v.shape, replicas)[1] if compressor is not None
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
        self.binding = binding(optimizer)
        self._functions = {}
        self._stats = {}
        self._settled = False  # compressing in the compressor's last stage: no step changes it

    def on_train_begin(self, logs=None):
        if self.model.steps_per_execution > 1 and self.binding.aggregate_every > 1:
            raise ValueError("aggregate_every > 1 needs steps_per_execution=1 (the phase changes "
                             "every step)")
        self._functions = {}
        self._select()

    def on_train_batch_begin(self, batch, logs=None):
        if self.binding.aggregate_every > 1 or not self._settled:
            self._select()

    def on_train_batch_end(self, batch, logs=None):
        self._add_stats(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._add_stats(logs)

    def _select(self):
        bound = self.binding
        step = int(bound.optimizer.iterations.numpy())
        compress = bound.compressor is not None and step >= bound.compressor.start_step
        every = bound.aggregate_every
        stage = bound.compressor.stage_at(step) if compress else None
        bound.phase = Phase(compress, every > 1 and (step + 1) % every != 0, stage)
        self._settled = compress and step >= bound.compressor.last_stage_step()
        if compress:
            bound.compressor.stage = stage  # what compress/payload_bytes read while tracing
        key = bound.phase.key()
        if key not in self._functions:  # traced on first call, under this phase
            self.model.make_train_function(force=True)
            self._functions[key] = self.model.train_function
        self.model.train_function = self._functions[key]

    def _add_stats(self, logs):
        if logs is not None:
            phase = self.binding.phase
            key = (phase.compress, phase.stage)
            if key not in self._stats:
                self._stats[key] = stats(self.model, compressing=phase.compress)
            logs.update(self._stats[key])


def _all_reduce_by_device(grads_and_vars, context, step) -> list:
    """Keras's plain gradient sum, with the model-parallel shards' gradients summed in their own
    devices' groups (`kdist.layers.placement`) instead of on the replica's device."""
    import tensorflow as tf

    pairs = list(grads_and_vars)
    summed = Comm(context, step).all_reduce_sum([tf.convert_to_tensor(g) for g, _ in pairs])
    return [(g, v) for g, (_, v) in zip(summed, pairs)]


def _patch_optimizer() -> list:
    """Patches Keras's TF optimizer (and `Trainer.compile`) to consult the binding."""
    from keras.src.backend.tensorflow import optimizer as tf_optimizer
    from keras.src.trainers import trainer as base_trainer

    def all_reduce(original):
        @functools.wraps(original)
        def _all_reduce_sum_gradients(self, grads_and_vars):
            import tensorflow as tf

            context = tf.distribute.get_replica_context()
            bound = binding(self)
            if context is None:
                return original(self, grads_and_vars)
            if bound is not None and (bound.compressor is not None or bound.balanced
                                      or bound.bucket_bytes):
                return bound.all_reduce_sum(grads_and_vars, context)
            if placement.own_group_devices([v for _, v in grads_and_vars], context.strategy):
                return _all_reduce_by_device(grads_and_vars, context, self.iterations)
            return original(self, grads_and_vars)

        return _all_reduce_sum_gradients

    def update_step(original):
        @functools.wraps(original)
        def _backend_update_step(self, grads, variables, learning_rate):
            bound = binding(self)
            if bound is None:
                return original(self, grads, variables, learning_rate)
            return bound.update_step(grads, variables, learning_rate, original)

        return _backend_update_step

    def weight_decay(original):
        @functools.wraps(original)
        def _apply_weight_decay(self, variables):
            bound = binding(self)
            if bound is None or not bound.accumulating:
                return original(self, variables)

        return _apply_weight_decay

    def build(original):
        @functools.wraps(original)
        def method(self, variables):
            original(self, variables)
            bound = binding(self)
            if bound is not None:
                bound.create_state(variables)

        return method

    def compile(original):
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            from kdist.balance import plan
            from kdist.ps import sync

            original(self, *args, **kwargs)
            plan.bind_active(self)  # kdist.scope(balance=...), read by bind_active's binding
            bind_active(self)
            sync.bind_active(self)  # kdist.scope(ps_sync=...): the same block binds all three

        return method

    return [registry.replace(tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients", all_reduce),
            registry.replace(tf_optimizer.TFOptimizer, "_backend_update_step", update_step),
            registry.replace(tf_optimizer.TFOptimizer, "_apply_weight_decay", weight_decay),
            registry.replace(tf_optimizer.TFOptimizer, "build", build),
            # On Trainer itself: Keras treats a compile() that differs from Trainer.compile as
            # custom and then skips compiling models it loads.
            registry.replace(base_trainer.Trainer, "compile", compile)]


_installed: list = []


def install() -> None:
    """Installs the optimizer patches once (they do nothing for optimizers without a binding)."""
    if not _installed:
        _installed.extend(_patch_optimizer())


def uninstall() -> None:
    registry.undo(_installed)
    _installed.clear()
