"""`Balance`: a model's shares of each global batch, given or to be measured.

>>> Balance.parse([3, 1]).shares
(0.75, 0.25)
>>> Balance.parse("measure").shares is None
True
"""

from __future__ import annotations

import dataclasses
import numbers

from kdist import strategies, validators
from kdist.validators import UsageError

MEASURE = "measure"
_FIX = 'give one share per replica (replica_id_in_sync_group order), or balance="measure"'


@dataclasses.dataclass(frozen=True)
class Balance:
    """Shares of the global batch per replica (None: measured in the first `fit`, and then kept
    with the model) and the measuring settings.

    Args:
        shares: one positive number per replica (normalised to sum to 1), or None to measure them.
        measure_steps: timed steps of the measurement (after `warmup_steps` untimed ones).
    """

    shares: tuple[float, ...] | None = None
    measure_steps: int = 5
    warmup_steps: int = 2
    given: tuple | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.shares is not None:
            object.__setattr__(self, "given", tuple(self.shares))
            object.__setattr__(self, "shares", _normalised(self.shares))
        validators.positive_int(self.measure_steps, "measure_steps")
        validators.non_negative_int(self.warmup_steps, "warmup_steps")

    @classmethod
    def parse(cls, value) -> "Balance | None":
        """None (equal split), "measure", a list of positive shares, or a `Balance`."""
        if value is None or isinstance(value, Balance):
            return value
        if value == MEASURE:
            return cls()
        if isinstance(value, str) or not hasattr(value, "__len__"):
            raise UsageError("balance", f"{value!r} is neither 'measure' nor a list of shares", _FIX)
        return cls(tuple(value))

    def check_for(self, strategy) -> None:
        """Refuses what cannot be balanced under `strategy`."""
        if strategies.is_parameter_server(strategy):
            raise UsageError("balance", "ParameterServer has no global batch to split (each worker "
                             "trains on its own batches, at its own pace)",
                             "drop balance=, or use ps_sync= to choose how updates synchronise")
        replicas = strategy.num_replicas_in_sync
        if self.shares is not None and len(self.shares) != replicas:
            raise UsageError("balance", f"{list(self.given)} gives {len(self.shares)} shares for "
                             f"{replicas} replica{'s' if replicas > 1 else ''}", _FIX)


def _normalised(shares) -> tuple[float, ...]:
    values = list(shares)
    if not values or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0
                             for v in values):
        raise UsageError("balance", f"{values!r} is not a list of positive numbers", _FIX)
    total = float(sum(values))
    return tuple(float(v) / total for v in values)
