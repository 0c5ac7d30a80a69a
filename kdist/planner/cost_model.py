"""The step-time model: t2 from the gradient bytes over the links, each batch's step, throughput
and efficiency, and the recommendation (`NEAR_BEST`).

>>> round(estimate(32, t1=0.010, t2=0.004, replicas=8).efficiency, 3)
0.714
>>> estimate(32, t1=0.010, t2=0.004, replicas=8, overlap=True).efficiency
1.0
"""

from __future__ import annotations

import dataclasses
import math

NEAR_BEST = 0.9  # a recommended batch's throughput is at least this share of the best measured

NOISY_SPREAD = 0.5  # a t1 whose measurements vary more than this is too noisy to act on


def gradient_bytes(model) -> int:
    return sum(4 * math.prod(v.shape) for v in model.trainable_variables)


def wire_bytes(model, compressor, replicas: int) -> dict[str, int]:
    """Bytes each worker contributes per step to each collective ("all_reduce", "all_gather"):
    what the compressor routes where (`Compressor.route`), the rest all-reduced as float32."""
    routed = {}
    for variable in model.trainable_variables:
        shape = tuple(variable.shape)
        collective, size = compressor.route(shape, replicas) \
            if compressor is not None and compressor.should_compress(shape) \
            else ("all_reduce", 4 * math.prod(shape))
        routed[collective] = routed.get(collective, 0) + size
    return routed


def communication_time(payload: int, collective: str, replicas: int, bandwidth: float,
                       latency: float, host_cost: float = 0.0) -> float:
    """t2 of a ring collective over `replicas` workers on links of `bandwidth` bits/s.

    `host_cost` is what moving one byte costs the worker's CPU (serialization, copies, the
    reduction: see `measure_host_cost`), paid in addition to the time on the wire.
    """
    if replicas < 2:
        return 0.0
    n = replicas
    if collective == "all_gather":  # every worker receives the n-1 other payloads
        volume, messages = (n - 1) * payload, n - 1
    else:  # ring all-reduce: reduce-scatter then all-gather
        volume, messages = 2 * (n - 1) / n * payload, 2 * (n - 1)
    return volume * (8 / bandwidth + host_cost) + messages * latency


@dataclasses.dataclass
class Estimate:
    per_replica_batch: int
    t1: float
    t2: float
    step: float
    throughput: float  # examples per second, all replicas
    efficiency: float  # t1 / step
    spread: float = 0.0  # of t1's timings: (slowest - best) / best
    compression: float = 0.0  # CPU seconds the compressor adds to each step, beside t1


def estimate(per_replica_batch: int, t1: float, t2: float, replicas: int,
             overlap: bool = False, spread: float = 0.0, compression: float = 0.0) -> Estimate:
    """One step: t1 plus the compressor's own CPU time (it runs between the backward pass and
    the exchange), then t2, or overlapped with it."""
    compute = t1 + compression
    step = max(compute, t2) if overlap else compute + t2
    return Estimate(per_replica_batch, t1, t2, step, replicas * per_replica_batch / step,
                    t1 / step, spread, compression)


@dataclasses.dataclass
class CompressionCost:
    """What a compressor costs and saves per step at one batch: its CPU time (`seconds`,
    measured) against t2 without it (`uncompressed`, the float32 gradients' time)."""

    name: str
    seconds: float
    uncompressed: Estimate  # the same batch without compression

    def verdict(self, compressed: Estimate) -> str:
        """Whether compression pays on this link, in one sentence with the numbers."""
        plain = self.uncompressed
        saved, ratio = plain.t2 - compressed.t2, compressed.step / plain.step
        numbers = (f"{self.seconds * 1e3:.2f} ms of CPU per step to compress, sum and decompress "
                   f"against {saved * 1e3:.2f} ms less communication; step "
                   f"{compressed.step * 1e3:.2f} ms with it, {plain.step * 1e3:.2f} ms without "
                   f"({ratio:.2f}x)")
        if compressed.step >= plain.step:
            return (f"{self.name} costs more than it saves on this link: {numbers}. Train "
                    "without it here (kdist.scope(compression=None)); it pays on slower links")
        return f"{self.name} pays on this link: {numbers}"


@dataclasses.dataclass
class Plan:
    replicas: int
    gradient_bytes: int
    wire_bytes: int
    collective: str
    estimates: list[Estimate]  # one per measured per-replica batch, ascending
    requested: Estimate
    recommended: Estimate  # see `recommend`
    max_global_batch: int | None = None
    compression: CompressionCost | None = None  # at the requested batch, when compressing

    def compression_verdict(self) -> str | None:
        """Whether the compression asked for pays at the requested batch (None: none asked)."""
        return self.compression.verdict(self.requested) if self.compression else None

    @property
    def best(self) -> Estimate:
        """The measured batch with the highest throughput."""
        return max(self.estimates, key=lambda e: e.throughput)

    def reason(self) -> str:
        """Why `recommended`, in one sentence."""
        chosen, best = self.recommended, self.best
        share = chosen.throughput / best.throughput
        why = (f"per-replica batch {chosen.per_replica_batch} (global "
               f"{self.replicas * chosen.per_replica_batch}): {chosen.throughput:,.0f} examples/s, "
               f"{share:.0%} of the best measured ({best.throughput:,.0f} at "
               f"{best.per_replica_batch})")
        if chosen is best:
            why += ", the fastest"
        if self.max_global_batch and self.replicas * best.per_replica_batch > self.max_global_batch:
            why += f"; the largest within --max-global-batch {self.max_global_batch}"
        elif chosen is not best:
            why += (f"; the smallest batch within {1 - NEAR_BEST:.0%} of it (a larger batch buys "
                    "little speed and may need more epochs to converge)")
        if chosen.t1 >= chosen.t2:
            why += f"; compute covers communication there (t1 >= t2, efficiency {chosen.efficiency:.0%})"
        else:
            why += (f"; communication still dominates there (t2 {chosen.t2 * 1e3:.2f} ms > t1 "
                    f"{chosen.t1 * 1e3:.2f} ms): compression, a faster network or fewer replicas "
                    "would pay")
        return why

    def warnings(self) -> list[str]:
        """Measurements to distrust: a t1 that falls as the batch grows (beyond the spread), and a
        recommended batch whose t1 varied more than `NOISY_SPREAD`."""
        found = []
        for smaller, larger in zip(self.estimates, self.estimates[1:]):
            if larger.t1 * (1 + max(smaller.spread, larger.spread)) < smaller.t1:
                found.append(f"t1 falls from {smaller.t1 * 1e3:.2f} ms at batch "
                             f"{smaller.per_replica_batch} to {larger.t1 * 1e3:.2f} ms at "
                             f"{larger.per_replica_batch}: the smaller batch's timing is noise or a "
                             "per-step cost (re-run on an idle machine; trust the larger batches)")
        chosen = self.recommended
        if chosen.spread > NOISY_SPREAD:
            found.append(f"t1 at the recommended batch {chosen.per_replica_batch} varied by "
                         f"{chosen.spread:.0%} between its measurements: the machine was busy, so "
                         "the recommendation may not hold; re-run on an idle machine before you "
                         "change the batch")
        return found

    def learning_rate_advice(self, base_batch: int) -> str:
        """The linear scaling rule from a learning rate tuned at batch `base_batch`."""
        global_batch = self.replicas * self.recommended.per_replica_batch
        return (f"global batch {global_batch}: learning rate = the one tuned at batch {base_batch} "
                f"x {global_batch / base_batch:g} (linear rule, kdist.scale_learning_rate), warmed "
                "up over the first epoch (kdist.LinearWarmup)")

    def table(self) -> str:
        compressing = f", compressing {self.compression.seconds * 1e3:.2f} ms per step (CPU)" \
            if self.compression else ""
        lines = [f"replicas {self.replicas}, gradients {self.gradient_bytes / 1e6:.2f} MB, on the "
                 f"wire {self.wire_bytes / 1e6:.3f} MB per worker ({self.collective})"
                 f"{compressing}", "",
                 "| per-replica batch | t1 (compute) | t1 spread | t2 (communicate) | step "
                 "| examples/s | efficiency |", "|---|---|---|---|---|---|---|"]
        for e in self.estimates:
            mark = (" (requested)" if e is self.requested else "") + \
                   (" (recommended)" if e is self.recommended else "")
            lines.append(f"| {e.per_replica_batch}{mark} | {e.t1 * 1e3:.2f} ms | {e.spread:.0%} "
                         f"| {e.t2 * 1e3:.2f} ms | {e.step * 1e3:.2f} ms | {e.throughput:,.0f} "
                         f"| {e.efficiency:.0%} |")
        return "\n".join(lines)

    def as_dict(self, base_batch: int) -> dict:
        """The plan as JSON-ready data (`kdist plan --json`)."""
        return {"replicas": self.replicas, "gradient_bytes": self.gradient_bytes,
                "wire_bytes": self.wire_bytes, "collective": self.collective,
                "estimates": [dataclasses.asdict(e) for e in self.estimates],
                "requested": self.requested.per_replica_batch,
                "recommended": self.recommended.per_replica_batch,
                "best": self.best.per_replica_batch, "max_global_batch": self.max_global_batch,
                "reason": self.reason(), "warnings": self.warnings(),
                "compression_seconds": self.compression.seconds if self.compression else 0.0,
                "compression": self.compression_verdict(),
                "learning_rate": self.learning_rate_advice(base_batch)}


def recommend(estimates: list[Estimate], replicas: int,
              max_global_batch: int | None = None) -> Estimate:
    """The smallest batch whose throughput is within `NEAR_BEST` of the best measured, among
    those whose global batch is at most `max_global_batch` (when none is, the smallest)."""
    allowed = [e for e in estimates if not max_global_batch
               or replicas * e.per_replica_batch <= max_global_batch] or estimates[:1]
    best = max(e.throughput for e in allowed)
    return next(e for e in allowed if e.throughput >= NEAR_BEST * best)
