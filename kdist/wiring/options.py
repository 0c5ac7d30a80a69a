"""`TrainingOptions`: what the models compiled inside one `kdist.scope(...)` train with, frozen.

One object holds every training option of a scope, parsed from strings or objects, validated once
against the strategy the scope enters (`checked_for`), and bound to each model compiled inside the
block (`kdist.model_state`):

- ``compression``: ``None``, a name of `kdist.compression.registry` (``"powersgd:4"``) or a
  `kdist.compression.Compressor`;
- ``aggregate_every``: all-reduce every k steps, accumulating locally in between;
- ``bucket_bytes``: all-reduce in buckets of about that many bytes, last layer first;
- ``balance``: ``"measure"`` or one share per replica (`kdist.balance`);
- ``ps_sync``: ``"async"``, ``"ksync:K"``, ``"kbatch:K"`` or ``"stale:S"`` (`kdist.ps.sync`);
- ``check_replicas``: ``"error"`` (default), ``"warn"`` or ``"off"``: what a mismatch between
  the replicas' copies of a variable at the end of an epoch does (`kdist.replicas`);
- ``watch_steps``, ``hang_timeout``, ``hang_action``: under MultiWorkerMirrored, time every step
  (input, compute, communication), summarise the stragglers at each epoch's end, and report a
  hang (`kdist.steps`).

>>> options = TrainingOptions.parse(compression="powersgd:2", aggregate_every=2)
>>> options.compression.rank, options.aggregate_every, str(options.ps_sync)
(2, 2, 'async')
>>> TrainingOptions.parse(compression="gzip")
Traceback (most recent call last):
...
kdist.validators.UsageError: compression: 'gzip' is not a compressor. Fix: use none, fp16, bf16, powersgd:RANK or topk:RATIO
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

from kdist import strategies, validators
from kdist.balance.shares import Balance
from kdist.compression.base import Compressor, NoCompression
from kdist.compression.registry import from_name, spelled
from kdist.ps.sync import SyncMode
from kdist.steps import watchdog
from kdist.validators import UsageError


@dataclasses.dataclass(frozen=True)
class TrainingOptions:
    """The training options of a `kdist.scope(...)` block (see the module docstring)."""

    compression: Compressor | None = None
    aggregate_every: int = 1
    bucket_bytes: int | None = None
    balance: Balance | None = None
    ps_sync: SyncMode = SyncMode("async")
    check_replicas: str = "error"
    watch_steps: bool = True
    hang_timeout: float | None = None  # None: KDIST_HANG_TIMEOUT, else the default rule
    hang_action: str = "report"

    @classmethod
    def parse(cls, compression=None, aggregate_every: int = 1, bucket_bytes=None, balance=None,
              ps_sync="async", check_replicas="error", watch_steps=True, hang_timeout=None,
              hang_action=None) -> "TrainingOptions":
        """The options from `kdist.scope()`'s arguments; a bad one raises `UsageError` naming it."""
        validators.positive_int(aggregate_every, "aggregate_every")
        if bucket_bytes is not None:
            validators.positive_int(bucket_bytes, "bucket_bytes")
        if check_replicas not in ("error", "warn", "off"):
            raise UsageError("check_replicas", f"{check_replicas!r} is not a mode",
                             "use 'error' (stop fit), 'warn' (log and go on) or 'off'")
        if not isinstance(watch_steps, bool):
            raise UsageError("watch_steps", f"{watch_steps!r} is not True or False",
                             "use True (default) or False")
        hang_timeout, hang_action = watchdog.settings(hang_timeout, hang_action)
        options = cls(_compressor(compression), aggregate_every, bucket_bytes,
                      Balance.parse(balance), SyncMode.parse(ps_sync), check_replicas,
                      watch_steps, hang_timeout, hang_action)
        if options.balance is not None and aggregate_every > 1:
            raise UsageError("balance", "given with aggregate_every > 1: the accumulated "
                             "micro-batches would need weights of their own",
                             "use one of them, or a larger global batch instead of "
                             "aggregate_every")
        return options

    @property
    def exchanges_gradients(self) -> bool:
        """Whether kdist's gradient exchange replaces Keras's one all-reduce."""
        return (self.compression is not None or self.aggregate_every > 1
                or self.bucket_bytes is not None or self.balance is not None)

    def checked_for(self, strategy) -> "TrainingOptions":
        """These options, refused with the reason and the fix where `strategy` cannot honour them."""
        parameter_server = strategies.is_parameter_server(strategy)
        if parameter_server and (self.compression is not None or self.aggregate_every != 1
                                 or self.bucket_bytes is not None):
            given = [name for name, value in (("compression", self.compression),
                                              ("aggregate_every", self.aggregate_every != 1),
                                              ("bucket_bytes", self.bucket_bytes))
                     if value not in (None, False)]
            raise UsageError(given[0], "applies to all-reduce strategies; under ParameterServer "
                             "no gradient is exchanged as such: a worker reads each variable (and "
                             "optimizer slot) from the ps and writes the updated float32 values "
                             "back, so casting or compressing gradients would not shrink that "
                             "traffic", "drop it, or train with MultiWorkerMirrored (no ps tasks)")
        if self.ps_sync.kind != "async" and not parameter_server:
            raise UsageError("ps_sync", f"{str(self.ps_sync)!r} is for ParameterServerStrategy; "
                             f"this scope runs {type(strategy).__name__}, whose replicas "
                             "all-reduce every step (synchronous already)",
                             "drop ps_sync, or add ps tasks to the cluster")
        if self.ps_sync.kind != "async" and strategy.num_replicas_in_sync > 1:
            raise UsageError("ps_sync", f"{str(self.ps_sync)!r} needs one replica per worker; each "
                             f"worker here has {strategy.num_replicas_in_sync} (several GPUs)",
                             "give each worker task one GPU (CUDA_VISIBLE_DEVICES) and run more "
                             "worker tasks, or use ps_sync='async'")
        if self.balance is not None:
            self.balance.check_for(strategy)
        return self


def _compressor(value):
    """A compressor from a name or an object (None, 'none' and NoCompression: Keras's own
    all-reduce, bit for bit)."""
    if value is None or isinstance(value, NoCompression):
        return None
    if isinstance(value, Compressor):
        return value
    if isinstance(value, str):
        return from_name(value)
    raise UsageError("compression", f"{value!r} is neither a name nor a compressor",
                     f"use {spelled()}, or a kdist.compression.Compressor such as "
                     "kdist.compression.PowerSGD(rank=4)")


_active = contextvars.ContextVar("kdist_training_options", default=TrainingOptions())


@contextlib.contextmanager
def activated(options: TrainingOptions):
    """Makes `options` what `compile()` binds inside this block."""
    token = _active.set(options)
    try:
        yield
    finally:
        _active.reset(token)


def active() -> TrainingOptions:
    """The options of the innermost `kdist.scope(...)` being entered (defaults outside any)."""
    return _active.get()
