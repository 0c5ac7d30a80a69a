"""What kdist keeps about one model, beside it: `ModelState` (its training options and what its
training needs between calls), and the gradient exchange bound to its optimizer.

Kept with `kdist.keras_seam.keras_internals.attach`, never as attributes of Keras objects.

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> of(model).options is None        # not compiled inside kdist.scope(...)
True
"""

from __future__ import annotations

from kdist.keras_seam import keras_internals


class ModelState:
    """kdist's state of one model.

    - `options`: the `TrainingOptions` it was compiled with (None: compiled outside kdist.scope,
      or never compiled: the defaults);
    - `shares`: `balance`'s shares of the global batch, once given or measured;
    - `fit_input`: (x, y, sample_weight, batch_size) of the `fit` running now, for
      `BackupAndRestore`'s position in examples;
    - `initial_step`: training steps the next epoch skips (a mid-epoch resume);
    - `sync`: the parameter-server synchronisation state (`kdist.ps.sync.SyncState`);
    - `functions`: tf.functions traced for this model by kdist's parameter-server loop.
    """

    def __init__(self, options=None):
        self.options = options
        self.shares = getattr(getattr(options, "balance", None), "shares", None)
        self.fit_input = None
        self.initial_step = 0
        self.sync = None
        self.functions: dict = {}
        # said that a train_step of the user's may differentiate a loss not divided by the
        # replicas (dispatch's Keras < 3.8 warning, or kdist.wiring.own_losses)
        self.warned_unscaled_step = False
        self.said_batch_statistics = False  # kdist.wiring.batch_statistics, once per model


def of(model) -> ModelState:
    """`model`'s state, created with the default options on first use."""
    state = keras_internals.attached(model)
    if state is None:
        state = ModelState()
        keras_internals.attach(model, state)
    return state


def bind(model, options) -> ModelState:
    """A fresh state for `model` compiled with `options` (a recompile starts over)."""
    state = ModelState(options)
    keras_internals.attach(model, state)
    return state


def exchange_of(model_or_optimizer):
    """The gradient exchange (`kdist.exchange.Exchange`) bound to a model's (or an optimizer's)
    optimizer, or None: Keras's own all-reduce."""
    optimizer = getattr(model_or_optimizer, "optimizer", model_or_optimizer)
    return keras_internals.attached(optimizer) if optimizer is not None else None


def bind_exchange(optimizer, exchange) -> None:
    keras_internals.attach(optimizer, exchange)
