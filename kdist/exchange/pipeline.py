"""`Exchange`: the one gradient-exchange pipeline of a model's optimizer.

Where Keras sums every replica's gradients in one all-reduce, a model compiled inside
`kdist.scope(compression=..., aggregate_every=k, bucket_bytes=n, balance=...)` exchanges them
through one pipeline, in this order:

1. **accumulate** (`aggregate_every=k`): k - 1 steps add the gradients locally, the k-th
   exchanges their mean (`update_step`);
2. **weigh** (`balance`): each gradient times this replica's examples (`kdist.exchange.weights`),
   the examples riding in the first collective;
3. **bucket** (`bucket_bytes`): last layer first, one collective per bucket (`buckets`);
4. **compress or route**: compressible gradients through the compressor (its own collectives),
   the rest summed by `Comm`, a model-parallel shard's in its device's group;
5. **unweigh**: the sums divided by the examples of all replicas.

A model with none of these options keeps Keras's own all-reduce (its model-parallel shards' sums
still go to their devices' groups, `plain_sum`). The compressor's phase (compress from
`start_step`, its warm-up stage, accumulate or reduce) is chosen per step by
`kdist.exchange.phases.PhaseCallback`, one traced train function per phase.

>>> Phase(compress=True, accumulate=False).key()
(True, False, None)
"""

from __future__ import annotations

import copy

from kdist.exchange import buckets, weights
from kdist.exchange.comm import Comm
from kdist.keras_seam import keras_internals


class Phase:
    """What the train function being traced does: compress or not (and the compressor's stage),
    accumulate or reduce."""

    def __init__(self, compress: bool, accumulate: bool, stage=None):
        self.compress, self.accumulate, self.stage = compress, accumulate, stage

    def key(self):
        return self.compress, self.accumulate, self.stage


class Exchange:
    """The exchange of one optimizer, for the options of the scope its model was compiled in,
    over `ring`: its strategy's TCP ring where that sums the gradients (`kdist.exchange.comm.
    tcp_ring`), else None (TensorFlow's collectives), decided when the model is compiled."""

    def __init__(self, optimizer, options, ring, keras_accumulation: int | None = None):
        compressor = options.compression
        # A copy per model: its stage is this model's, and the user's object stays as given.
        self.compressor = copy.copy(compressor) if compressor is not None else None
        self.optimizer = optimizer
        self.ring = ring
        self.aggregate_every = options.aggregate_every
        # Keras's own gradient_accumulation_steps, run in phases under several replicas
        # (kdist.keras_seam.one_device_fixes): Keras accumulates, the phase says when it applies.
        self.keras_accumulation = keras_accumulation
        self.bucket_bytes = options.bucket_bytes  # None: one batch, as Keras
        self.balanced = options.balance is not None
        self.traced_buckets: list = []  # the variables of each bucket, as last traced
        self.phase = Phase(compress=self.compressor is not None
                           and self.compressor.start_step == 0,
                           accumulate=self.accumulation_steps > 1)
        self.states: dict = {}  # var_key(variable) -> {name: per-replica variable}

    @property
    def accumulation_steps(self) -> int:
        """Steps per applied update: kdist's aggregate_every, or Keras's accumulation steps."""
        return self.keras_accumulation or self.aggregate_every

    @property
    def has_phases(self) -> bool:
        """Whether `fit` needs the `PhaseCallback` (compression or accumulation)."""
        return self.compressor is not None or self.accumulation_steps > 1

    def enter_phase(self, phase: Phase) -> None:
        """What the next trace of the train function does (set by `PhaseCallback`)."""
        self.phase = phase
        if phase.compress:
            self.compressor.enter_stage(phase.stage)  # what compress/payload_bytes read

    # ------------------------------------------------------------------ state
    def create_state(self, variables) -> None:
        """Per-replica optimizer variables (saved and restored with the optimizer in checkpoints):
        each compressible variable's compressor state, and accumulators when aggregate_every > 1."""
        self.states = {}
        for variable in variables:
            spec = dict(self.compressor.state_spec(variable.shape)) if self._compresses(variable) \
                else {}
            if self.aggregate_every > 1:
                spec["accumulator"] = (tuple(variable.shape), "zeros")
            state = {}
            with keras_internals.per_replica_variables("mean"):
                for name, (shape, initializer) in spec.items():
                    state[name] = keras_internals.add_optimizer_variable(
                        self.optimizer, shape, initializer, variable.dtype,
                        name=f"{variable.path.replace('/', '_')}_kdist_{name}")
            self.states[keras_internals.var_key(self.optimizer, variable)] = state

    def _compresses(self, variable) -> bool:
        return self.compressor is not None and self.compressor.should_compress(variable.shape)

    def _state(self, variable) -> dict:
        return self.states[keras_internals.var_key(self.optimizer, variable)]

    # ------------------------------------------------------------------ the exchange
    def exchange(self, grads_and_vars, replica_context):
        """Keras's `_all_reduce_sum_gradients` through the pipeline (module docstring, 2-5)."""
        import tensorflow as tf

        pairs = list(grads_and_vars)
        present = [(i, g, v) for i, (g, v) in enumerate(pairs) if g is not None]
        grads = [g for _, g, _ in present]  # IndexedSlices stay sparse: Comm gathers them
        compressed = {k for k, (_, g, v) in enumerate(present) if self.phase.compress
                      and self._compresses(v) and not isinstance(g, tf.IndexedSlices)}
        comm = Comm(replica_context, self.optimizer.iterations, self.ring)
        # Weighed by the replica's examples: every gradient under balance, else the exact sums
        # (a compressor's scale, its clipping and residuals, stays Keras's gradient's).
        weighed = []
        if self.balanced:
            weighed = list(range(len(grads)))
        elif weights.weighed_batch_size() is not None:
            weighed = [k for k in range(len(grads)) if k not in compressed]
        riders = []
        if weighed:
            scaled, examples = weights.weigh([grads[k] for k in weighed], comm.replicas)
            grads = list(grads)
            for k, grad in zip(weighed, scaled):
                grads[k] = grad
            riders = [examples]  # summed in the same all-reduce as the first plain gradients
        groups = buckets.buckets([t.shape.num_elements() * t.dtype.size for t in grads],
                                 self.bucket_bytes) if self.bucket_bytes \
            else [list(range(len(present)))]
        self.traced_buckets = [[present[k][2].name for k in group] for group in groups]
        summed, examples = {}, None
        for index, group in enumerate(groups):  # one collective (or compressor round) per bucket
            extra = riders if index == 0 else []
            chosen = [k for k in group if k in compressed]
            plain = [k for k in group if k not in chosen]
            reduced = comm.all_reduce_sum([grads[k] for k in plain] + extra)
            summed.update(zip(plain, reduced))
            if extra:
                examples = reduced[-1]
            if chosen:
                states = [self._state(present[k][2]) for k in chosen]
                summed.update(zip(chosen, self.compressor.aggregate([grads[k] for k in chosen],
                                                                    states, comm)))
        if riders:
            summed.update(zip(weighed, weights.unweigh([summed[k] for k in weighed], examples)))
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

    def apply_weight_decay(self, variables, original):
        """Weight decay once per applied update: not in the accumulate phases."""
        if not self.phase.accumulate:
            return original(self.optimizer, variables)
        return None


def plain_sum(grads_and_vars, replica_context, step, ring) -> list:
    """Keras's plain gradient sum, through `Comm` (`ring`'s sums on CPU workers, the
    model-parallel shards' in their own devices' groups, sparse gradients gathered), each replica's
    gradients weighted by its examples where its `train_step` recorded them (`weights`)."""
    pairs = list(grads_and_vars)
    comm = Comm(replica_context, step, ring)
    grads, riders = [g for g, _ in pairs], []
    if weights.weighed_batch_size() is not None:
        grads, examples = weights.weigh(grads, comm.replicas)
        riders = [examples]
    summed = comm.all_reduce_sum(grads + riders)
    if riders:
        summed = weights.unweigh(summed[:-1], summed[-1])
    return [(g, v) for g, (_, v) in zip(summed, pairs)]
