"""`plan`: t1 measured at batches around the user's, t2 computed, each estimated and the batch
recommended; `plot` draws them."""

from __future__ import annotations

from kdist.planner.cost_model import (CompressionCost, Plan, communication_time, estimate,
                                      gradient_bytes, recommend, wire_bytes)
from kdist.planner.measure import measure_compression, measure_compute


def plan(model_fn, per_replica_batch: int, replicas: int, bandwidth: float, latency: float = 0.0,
         compressor=None, overlap: bool = False, host_cost: float = 0.0,
         measure=measure_compute, max_global_batch: int | None = None,
         progress=lambda message: None, compression_cost=measure_compression) -> Plan:
    """Measures t1 for per-replica batches from per_replica_batch/8 to 8x and estimates each.

    `measure(model_fn, batch)` returns t1 or (t1, spread); `compression_cost(model, compressor,
    replicas)` the compressor's CPU seconds per step; `progress(message)` hears of each
    measurement before it starts."""
    if per_replica_batch < 1 or replicas < 1:
        raise ValueError("--per-replica-batch and --replicas must be >= 1")
    model = model_fn()

    def t2_of(routed):
        return sum(communication_time(payload, collective, replicas, bandwidth, latency,
                                      host_cost) for collective, payload in routed.items())

    routed = wire_bytes(model, compressor, replicas)
    t2 = t2_of(routed)
    compresses = compressor is not None and replicas > 1  # one replica sends nothing
    compressing = 0.0
    if compresses:
        progress(f"measuring what {compressor!r} costs this CPU per step")
        compressing = compression_cost(model, compressor, replicas)
    batches = sorted({max(1, per_replica_batch * 2 ** k // 8) for k in range(7)})
    estimates = []
    for i, batch in enumerate(batches):
        progress(f"measuring t1 at per-replica batch {batch} ({i + 1}/{len(batches)})")
        timing = measure(model_fn, batch)
        t1, spread = timing if isinstance(timing, tuple) else (timing, 0.0)
        estimates.append(estimate(batch, t1, t2, replicas, overlap, spread, compressing))
    requested = next(e for e in estimates if e.per_replica_batch == per_replica_batch)
    cost = None
    if compresses:
        plain = estimate(requested.per_replica_batch, requested.t1,
                         t2_of(wire_bytes(model, None, replicas)), replicas, overlap,
                         requested.spread)
        cost = CompressionCost(type(compressor).__name__, compressing, plain)
    return Plan(replicas, gradient_bytes(model), sum(routed.values()), " + ".join(sorted(routed)),
                estimates, requested, recommend(estimates, replicas, max_global_batch),
                max_global_batch, cost)


def plot(result: Plan, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = [e.per_replica_batch for e in result.estimates]
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot(batches, [e.t1 * 1e3 for e in result.estimates], "o-", label="t1 compute (measured)")
    axis.plot(batches, [e.t2 * 1e3 for e in result.estimates], "--", label="t2 communicate")
    axis.plot(batches, [e.step * 1e3 for e in result.estimates], "s-", label="step (predicted)")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("per-replica batch")
    axis.set_ylabel("ms")
    axis.set_title(f"{result.replicas} replicas")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
