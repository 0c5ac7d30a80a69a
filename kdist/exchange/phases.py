"""`PhaseCallback`: the traced train function for each phase of a model's gradient exchange, and
the byte statistics it puts in the logs.

Collectives cannot sit inside `tf.cond` under tf.distribute, so each phase (uncompressed warm-up
until the compressor's `start_step`, each of its stages, accumulate or reduce with
`aggregate_every`) is traced once and the callback hands `fit` the one the next step needs.
`kdist.wiring` adds it to `fit` for a model whose exchange has phases.
"""

from __future__ import annotations

import keras

from kdist.exchange.pipeline import Phase
from kdist.exchange.stats import stats
from kdist.keras_seam import keras_internals


class PhaseCallback(keras.callbacks.Callback):
    """Before each step, picks the phase of `exchange` and the train function traced for it; puts
    the byte statistics in the logs."""

    def __init__(self, exchange):
        super().__init__()
        self.exchange = exchange
        self._functions = {}
        self._stats = {}
        self._settled = False  # compressing in the compressor's last stage: no step changes it

    def on_train_begin(self, logs=None):
        if self.model.steps_per_execution > 1 and self.exchange.accumulation_steps > 1:
            given = "gradient_accumulation_steps" if self.exchange.keras_accumulation \
                else "aggregate_every"
            raise ValueError(f"{given} > 1 needs steps_per_execution=1 under several replicas "
                             "(the phase changes every step)")
        self._functions = {}
        self._select()

    def on_train_batch_begin(self, batch, logs=None):
        if self.exchange.accumulation_steps > 1 or not self._settled:
            self._select()

    def on_train_batch_end(self, batch, logs=None):
        self._add_stats(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._add_stats(logs)

    def _select(self):
        exchange = self.exchange
        step = int(exchange.optimizer.iterations.numpy())
        micro_step = keras_internals.gradients_applied(exchange.optimizer)
        compressor = exchange.compressor
        compress = compressor is not None and step >= compressor.start_step
        every = exchange.accumulation_steps
        exchange.enter_phase(Phase(compress, every > 1 and (micro_step + 1) % every != 0,
                                   compressor.stage_at(step) if compress else None))
        self._settled = compress and step >= compressor.last_stage_step()
        key = exchange.phase.key()
        if key not in self._functions:  # traced on first call, under this phase
            self.model.make_train_function(force=True)
            self._functions[key] = self.model.train_function
        keras_internals.set_train_function(self.model, self._functions[key])

    def _add_stats(self, logs):
        if logs is not None:
            phase = self.exchange.phase
            key = (phase.compress, phase.stage)
            if key not in self._stats:
                self._stats[key] = stats(self.model, compressing=phase.compress)
            logs.update(self._stats[key])
