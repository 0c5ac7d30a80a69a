"""Options shared by every strategy builder, validated once.

`StrategyOptions` is what `kdist.scope(**options)` accepts. Each strategy module declares the option
names it uses (`OPTIONS`); options that do not apply to the chosen strategy are reported by
`kdist.scope()` in its log line, never dropped silently.
"""

from __future__ import annotations

from kdist import validators

import dataclasses
from typing import Any, Callable

ALL_REDUCE = ("auto", "ring", "nccl", "tcp")
# The shares of dead_peer_timeout each detector waits (StrategyOptions.heartbeat_timeout,
# .ring_timeout): every one below the bound, so that the worker fails within it.
HEARTBEAT_SHARE, RING_SHARE = 0.4, 0.8
PS_EVALUATION = ("workers", "chief")


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """Options for building a `tf.distribute` strategy.

    Args:
        devices: device names for Mirrored (e.g. ``["/cpu:0", "/cpu:1"]``) or one device for the
            one-device strategy. None: every local GPU, else the logical CPU devices configured.
            MultiWorkerMirrored: the GPUs each worker replicates over, ``["/gpu:0", ...,
            "/gpu:k-1"]``; ``["/gpu:0"]`` leaves the other GPUs to model-parallel layers (hybrid).
        all_reduce: who sums the gradients. ``"auto"`` (default): under MultiWorkerMirrored with one
            replica per worker on its CPU, kdist's ring all-reduce over TCP (`kdist.exchange.ring`,
            `kdist.strategies.multi_worker.sums_over_tcp`); elsewhere TensorFlow's choice (NCCL
            between GPUs). ``"ring"`` or ``"nccl"``: TensorFlow's collective implementation for the
            gradients too. ``"tcp"``: kdist's ring, asked for (an error where a worker runs several
            replicas). Beside the gradients only the step's logs ride the ring; TensorFlow's
            collectives carry the rest (batch-norm statistics).
        bytes_per_pack: pack gradients into chunks of this many bytes before all-reducing (0: TF's
            default of one pack per dtype).
        collective_timeout: seconds after which one collective fails (None: no per-op limit).
        dead_peer_timeout: MultiWorkerMirrored: a worker whose peer died, hung or became
            unreachable fails within this many seconds (default 60) instead of waiting forever;
            TF's coordination service then declares a task dead after 40% of it without a
            heartbeat, and kdist's TCP ring gives up on a peer silent for 80% of it.
        startup_timeout: MultiWorkerMirrored and ParameterServer: seconds this task waits for
            the other tasks to start (default: ``KDIST_STARTUP_TIMEOUT``, else 600), saying
            whom it waits for meanwhile; then it exits with code 69 naming them
            (`kdist.startup`).
        variable_partitioner: ParameterServer only; a `tf.distribute.experimental.partitioners`
            partitioner that shards large variables over the ps tasks.
        ps_evaluation: ParameterServer only; ``"workers"`` (default): `evaluate` and `fit`'s
            validation run on the workers, each example counted exactly once
            (`kdist.ps.evaluation`); ``"chief"``: they run on the chief alone.
        ps_shard_input: ParameterServer only; True: a dataset function (or NumPy input) is read
            as one input pipeline per worker, so each worker reads a disjoint part of the data
            (the `InputContext` names the worker); False (default): every worker reads it all.
    """

    devices: tuple[str, ...] | None = None
    all_reduce: str = "auto"
    bytes_per_pack: int = 0
    collective_timeout: float | None = None
    dead_peer_timeout: float = 60.0
    startup_timeout: float | None = None
    variable_partitioner: Callable | None = None
    ps_evaluation: str = "workers"
    ps_shard_input: bool = False

    def __post_init__(self):
        if self.devices is not None:
            devices = (self.devices,) if isinstance(self.devices, str) else tuple(self.devices)
            if not devices or not all(isinstance(d, str) and d for d in devices):
                raise ValueError(f"devices={self.devices!r}: give a non-empty list of device names "
                                 "such as ['/cpu:0', '/cpu:1'], or leave it unset")
            object.__setattr__(self, "devices", devices)
        if self.all_reduce not in ALL_REDUCE:
            raise ValueError(f"all_reduce={self.all_reduce!r}: use one of {', '.join(ALL_REDUCE)}")
        validators.non_negative_int(self.bytes_per_pack, "bytes_per_pack")  # 0: TF chooses
        if self.collective_timeout is not None and not (
                isinstance(self.collective_timeout, (int, float)) and self.collective_timeout > 0):
            raise ValueError(f"collective_timeout={self.collective_timeout!r}: use a positive number "
                             "of seconds, or None to wait forever")
        if self.ps_evaluation not in PS_EVALUATION:
            raise ValueError(f"ps_evaluation={self.ps_evaluation!r}: use 'workers' (shards over the "
                             "workers, exactly once) or 'chief' (the chief alone)")
        if not isinstance(self.ps_shard_input, bool):
            raise ValueError(f"ps_shard_input={self.ps_shard_input!r}: use True (each worker reads "
                             "its own part of the data) or False (every worker reads all of it)")
        if self.startup_timeout is not None and (isinstance(self.startup_timeout, bool) or not (
                isinstance(self.startup_timeout, (int, float)) and 0 < self.startup_timeout
                < float("inf"))):
            raise ValueError(f"startup_timeout={self.startup_timeout!r}: use a positive number of "
                             "seconds, or None for KDIST_STARTUP_TIMEOUT (default 600)")
        if isinstance(self.dead_peer_timeout, bool) or not (
                isinstance(self.dead_peer_timeout, (int, float)) and self.dead_peer_timeout >= 3):
            raise ValueError(f"dead_peer_timeout={self.dead_peer_timeout!r}: use a number of seconds "
                             ">= 3 (TF checks peers with RPCs that need a few seconds)")

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds without a heartbeat after which TF's coordination service declares a task
        dead: 40% of `dead_peer_timeout`, leaving the rest for the error to abort the
        collectives, reach the user's code and end the process (about 3 s on this machine)."""
        return HEARTBEAT_SHARE * self.dead_peer_timeout

    @property
    def ring_timeout(self) -> float:
        """Seconds kdist's TCP ring waits for a silent peer: `collective_timeout` where set, else
        80% of `dead_peer_timeout`, the rest being the time to fail the step and end the
        process within the bound (the whole bound ended 0.9 s past it).

        >>> StrategyOptions(dead_peer_timeout=10).ring_timeout
        8.0
        """
        return self.collective_timeout or RING_SHARE * self.dead_peer_timeout

    @classmethod
    def from_kwargs(cls, options: dict[str, Any], also: tuple[str, ...] = (),
                    caller: str = "kdist.scope()") -> "StrategyOptions":
        """Builds options from keyword arguments, rejecting an unknown name with the one meant
        and every valid one (`also`: the caller's own options, such as the scope's training
        options)."""
        import difflib

        names = {f.name for f in dataclasses.fields(cls)} | set(also)
        unknown = sorted(set(options) - names)
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.6)
            meant = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{caller} got unknown option {unknown[0]!r}{meant}; valid options: "
                            f"{', '.join(sorted(names))}")
        return cls(**options)

    def given(self) -> set[str]:
        """Names of the options that differ from their defaults."""
        return {f.name for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def communication_options(self):
        """The `tf.distribute.experimental.CommunicationOptions` these options describe."""
        import tensorflow as tf

        name = "auto" if self.all_reduce == "tcp" else self.all_reduce  # TF's: all but gradients
        implementation = tf.distribute.experimental.CommunicationImplementation[name.upper()]
        return tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=self.bytes_per_pack, timeout_seconds=self.collective_timeout,
            implementation=implementation)
