"""Where `balance` meets Keras's `fit`: the training input is re-split once the model is built.

Keras's `fit` builds its training `TFEpochIterator` with an equal split, then builds the model from
the first batch (`_maybe_symbolic_build`). kdist's hook after that build measures the shares if they
are still unknown (on that equal split) and replaces the iterator's distributed dataset with the
proportional one (`split.distribute`). Only the training iterator of the `fit` being run changes.
"""

from __future__ import annotations

import contextlib
import contextvars

from kdist.balance import split
from kdist.balance.measure import measure_shares
from kdist.keras_seam import keras_internals
from kdist import model_state as states

_pending = contextvars.ContextVar("kdist_balance_fit", default=None)


@contextlib.contextmanager
def fitting(model):
    """Around `model.fit`: the first iterator Keras builds the model from is the training one."""
    options = states.of(model).options
    token = _pending.set([model] if options is not None and options.balance is not None else [])
    try:
        yield
    finally:
        _pending.reset(token)


def after_symbolic_build(model, epoch_iterator) -> None:
    """Splits `epoch_iterator`'s batches in proportion to the model's shares (measured first if
    needed), if it is the training iterator of a balanced `fit`."""
    pending = _pending.get()
    if not pending or pending[0] is not model:
        return
    pending.clear()
    state = states.of(model)
    plan = state.options.balance
    if state.shares is None:
        state.shares = measure_shares(model, keras_internals.distributed_dataset(epoch_iterator),
                                      plan.measure_steps, plan.warmup_steps)
    keras_internals.replace_distributed_dataset(epoch_iterator, lambda dataset: split.distribute(
        dataset, model.distribute_strategy, state.shares))
