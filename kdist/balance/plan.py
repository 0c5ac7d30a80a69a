"""`Balance`: a model's shares of each global batch, given or measured, and how compile binds it.

>>> Balance.parse([3, 1]).shares
(0.75, 0.25)
>>> Balance.parse("measure").shares is None
True
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import numbers

from kdist import validators
from kdist.validators import UsageError

logger = logging.getLogger("kdist")

MEASURE = "measure"
_FIX = 'give one share per replica (replica_id_in_sync_group order), or balance="measure"'


class Balance:
    """Shares of the global batch per replica (None until measured) and the measuring settings.

    Args:
        shares: one positive number per replica, or None to measure them in the first `fit`.
        measure_steps: timed steps of the measurement (after `warmup_steps` untimed ones).
    """

    def __init__(self, shares=None, measure_steps: int = 5, warmup_steps: int = 2):
        self.given = None if shares is None else list(shares)
        self.shares = None if shares is None else _normalised(shares)
        self.measure_steps = validators.positive_int(measure_steps, "measure_steps")
        self.warmup_steps = validators.non_negative_int(warmup_steps, "warmup_steps")

    @classmethod
    def parse(cls, value) -> "Balance | None":
        """None (equal split), "measure", or a list of positive shares."""
        if value is None or isinstance(value, Balance):
            return value
        if value == MEASURE:
            return cls()
        if isinstance(value, str) or not hasattr(value, "__len__"):
            raise UsageError("balance", f"{value!r} is neither 'measure' nor a list of shares", _FIX)
        return cls(value)

    def checked_for(self, strategy) -> "Balance":
        """A copy for one model under `strategy`, refusing what cannot be balanced."""
        from kdist import strategies

        if strategies.is_parameter_server(strategy):
            raise UsageError("balance", "ParameterServer has no global batch to split (each worker "
                             "trains on its own batches, at its own pace)",
                             "drop balance=, or use ps_sync= to choose how updates synchronise")
        replicas = strategy.num_replicas_in_sync
        if self.shares is not None and len(self.shares) != replicas:
            raise UsageError("balance", f"{self.given} gives {len(self.shares)} shares for "
                             f"{replicas} replica{'s' if replicas > 1 else ''}", _FIX)
        return Balance(self.given, self.measure_steps, self.warmup_steps)

    def __repr__(self):
        return f"Balance(shares={self.shares})"


def _normalised(shares) -> tuple[float, ...]:
    values = list(shares)
    if not values or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0
                             for v in values):
        raise UsageError("balance", f"{values!r} is not a list of positive numbers", _FIX)
    total = float(sum(values))
    return tuple(float(v) / total for v in values)


_active = contextvars.ContextVar("kdist_balance", default=None)


@contextlib.contextmanager
def activated(value):
    """Makes `balance=value` what `compile()` binds inside this block."""
    token = _active.set(Balance.parse(value))
    try:
        yield
    finally:
        _active.reset(token)


def bind_active(model) -> None:
    """Called by `compile()`: the active balance becomes the model's (``model._kdist_balance``),
    and the model's `train_step` records each replica's batch size for the gradient weights."""
    from kdist.balance import weights

    plan = _active.get()
    if plan is None:
        return
    strategy = model.distribute_strategy
    checked = plan.checked_for(strategy)
    if strategy.num_replicas_in_sync == 1:
        logger.info("kdist: balance=%s with one replica: nothing to balance", plan)
        return
    model._kdist_balance = checked
    if not getattr(model.train_step, "_kdist_records_batch", False):
        object.__setattr__(model, "train_step", weights.recording_batch_size(model.train_step))


def of(model) -> Balance | None:
    return getattr(model, "_kdist_balance", None)


def shares_of(model) -> tuple[float, ...] | None:
    """The shares a model trains with (one per replica), or None: equal split, or not measured yet.

    >>> import keras
    >>> shares_of(keras.Sequential()) is None
    True
    """
    plan = of(model)
    return None if plan is None else plan.shares
