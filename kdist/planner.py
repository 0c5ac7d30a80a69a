"""`kdist plan`: the step-time model max(t1, t2) / t1 + t2 turned into numbers for your model.

With n replicas each computing a per-replica batch b in time t1 (measured here, on this machine)
and exchanging the gradients in time t2 (computed: a ring all-reduce sends 2(n-1)/n of the
gradient bytes per worker in 2(n-1) messages; a compressor shrinks the bytes; top-k all-gathers;
each byte also costs the host's CPU the time a real all-reduce on this machine's loopback takes
per byte, measured by `measure_host_cost`),
one synchronous step costs

    t1 + t2        when the exchange starts after the backward pass (Keras + tf.distribute: the
                   optimizer all-reduces the finished gradients; the default, as measured by
                   benchmarks/planner_validation.py), or
    max(t1, t2)    with perfect overlap of computation and communication (``overlap=True``).

Throughput is n b / step and scaling efficiency t1 / step. The recommendation is the classic
trade-off: a batch large enough that the step is not spent communicating (t1 >= t2) or on per-step
overhead, and no larger than convergence needs. Concretely, the smallest measured per-replica batch
whose throughput is within 10% of the best measured (`NEAR_BEST`), at most `max_global_batch`
(the largest global batch your model still converges at, when you know it), with the linear
learning-rate scaling (plus warm-up) that goes with its global batch. Each t1 is the best of several
timings; their spread is reported, and a t1 that falls as the batch grows is named (noise, or a
per-step cost that hides the compute).

    kdist plan --model examples/plan_model.py:mlp --per-replica-batch 64 \\
        --replicas 8 --bandwidth 1Gbit --latency 50us --compression powersgd:4
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import re
import time

from kdist.validators import UsageError

_PREFIXES = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
NEAR_BEST = 0.9  # a recommended batch's throughput is at least this share of the best measured
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_NUMBER = r"((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"  # ASCII digits only


def parse_bandwidth(text: str) -> float:
    """A link speed -> bits per second: ``1Gbit``, ``1Gbps``, ``1 Gb/s``, ``10G`` (bits, as links
    are sold), ``100Mbit/s``; ``125MB/s`` and ``1GBps`` are bytes (a capital B).

    >>> parse_bandwidth("1Gbps") == parse_bandwidth("1 Gb/s") == parse_bandwidth("125MB/s") == 1e9
    True
    >>> parse_bandwidth("1.2.3Gbit")
    Traceback (most recent call last):
    ...
    kdist.validators.UsageError: --bandwidth: '1.2.3Gbit' is not a link speed. Fix: write a positive number and a unit, e.g. 100Mbit, 1Gbps, 10Gb/s, 125MB/s
    """
    match = re.fullmatch(rf"\s*{_NUMBER}\s*([kKmMgGtT]?)(bits?|b|B|[bB]ytes?)?(/s|ps)?\s*", text or "")
    value = math.nan
    if match and (match.group(2) or match.group(3)):
        bits_per_unit = 8 if (match.group(3) or "b").startswith(("B", "byte")) else 1
        value = float(match.group(1)) * _PREFIXES[match.group(2).lower()] * bits_per_unit
    if not (math.isfinite(value) and value > 0):
        raise UsageError("--bandwidth", f"{text!r} is not a link speed",
                         "write a positive number and a unit, e.g. 100Mbit, 1Gbps, 10Gb/s, 125MB/s")
    return value


def parse_latency(text: str) -> float:
    """``"50us"``, ``"1ms"`` -> seconds."""
    match = re.fullmatch(rf"\s*{_NUMBER}\s*(s|ms|us|ns)\s*", text or "")
    value = float(match.group(1)) * _SECONDS[match.group(2)] if match else math.nan
    if not math.isfinite(value):
        raise UsageError("--latency", f"{text!r} is not a duration",
                         "write a number and s, ms, us or ns, e.g. 50us")
    return value


def parse_compression(text: str | None):
    """``none``, ``fp16``, ``bf16``, ``powersgd:RANK``, ``topk:RATIO`` -> a kdist compressor."""
    from kdist.compression.names import from_name

    try:
        return from_name(text)
    except UsageError as err:
        raise err.renamed("--compression") from None


def parse_host_cost(text: str) -> float | None:
    """``auto`` -> None (measure it); a number of ns per byte (>= 0) -> seconds per byte."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError("--host-cost", f"{text!r} is not a cost",
                         "use auto, or a number of ns per byte >= 0")
    return value * 1e-9


def load_model_function(spec: str):
    """``package.module:function`` or ``path/to/file.py:function`` -> the function."""
    module_name, sep, function = spec.partition(":")
    if not sep or not function or not module_name:
        raise UsageError("--model", f"{spec!r} names no function",
                         "write module:function or path/file.py:function")
    if module_name.endswith(".py") and not os.path.isfile(module_name):
        raise UsageError("--model", f"no such file {module_name!r}", "check the path")
    try:
        if module_name.endswith(".py"):
            loaded = importlib.util.spec_from_file_location("kdist_plan_model", module_name)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:  # whatever the user's module raises while it is imported
        message = str(err).splitlines()[0] if str(err) else "no message"
        raise UsageError("--model", f"cannot import {module_name!r} ({type(err).__name__}: "
                         f"{message})", "fix the module, or the path / PYTHONPATH") from None
    if not callable(getattr(module, function, None)):
        raise UsageError("--model", f"{module_name} has no function {function!r}",
                         "name a function that returns a Keras model")
    return _checked_model_function(getattr(module, function), spec)


def _checked_model_function(function, spec: str):
    """`function` as a model function whose failures name --model: an exception it raises, or a
    return value that is not a built Keras model, becomes a `UsageError`."""
    def model_fn():
        import keras

        try:
            model = function()
        except Exception as err:  # whatever the user's function raises
            message = str(err).splitlines()[0] if str(err) else "no message"
            raise UsageError("--model", f"{spec} raised {type(err).__name__}: {message}",
                             "fix the function so that it returns a Keras model") from None
        if not isinstance(model, keras.Model):
            raise UsageError("--model", f"{spec} returned {type(model).__name__}, not a Keras "
                             "model", "return a keras.Model with its input shape (keras.Input)")
        try:
            inputs = model.inputs
        except (AttributeError, ValueError):  # a subclassed model that was never called
            inputs = None
        if not inputs:
            raise UsageError("--model", f"{spec} returned a model without input shapes",
                             "build it with keras.Input(shape) (a Sequential or functional model)")
        return model

    return model_fn


# ------------------------------------------------------------------------------- the model
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


def measure_host_cost(payload: int, timeout: float = 300) -> float:
    """Seconds per byte a real all-reduce costs this machine's CPUs when the wire is free: two
    MultiWorkerMirrored workers on the loopback (`kdist launch`) all-reduce `payload` bytes."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "host_cost.json")
        code = f"from kdist.planner import _host_cost_task; _host_cost_task({payload}, {out!r})"
        subprocess.run([sys.executable, "-m", "kdist", "launch", "--workers", "2", "--timeout",
                        str(timeout), "--", sys.executable, "-c", code], check=True,
                       timeout=timeout + 30,  # the launcher stops its tasks within that
                       stdout=subprocess.DEVNULL, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        with open(out) as f:
            seconds = json.load(f)["seconds"]
    return seconds / payload  # n = 2: each worker moves 2(n-1)/n x payload = payload bytes


def _host_cost_task(payload: int, out: str, repeats: int = 20) -> None:
    import json

    import kdist

    strategy = kdist.strategy("multi_worker")
    import tensorflow as tf

    values = tf.ones([payload // 4])

    @tf.function
    def all_reduce():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", values))

    for _ in range(3):
        all_reduce()
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        float(strategy.experimental_local_results(all_reduce())[0][0])
        timings.append(time.perf_counter() - started)
    if kdist.cluster().is_chief:
        with open(out, "w") as f:
            json.dump({"seconds": sorted(timings)[len(timings) // 2]}, f)


def measure_compute_time(model_fn, per_replica_batch: int, steps: int = 8, repeats: int = 5) -> float:
    """t1: seconds of one training step of `model_fn()` on one replica of this machine (the best
    of `repeats` averages over `steps` steps, so that noise from other processes is left out)."""
    return measure_compute(model_fn, per_replica_batch, steps, repeats)[0]


def measure_compute(model_fn, per_replica_batch: int, steps: int = 8,
                    repeats: int = 5) -> tuple[float, float]:
    """(t1, spread): `measure_compute_time`'s best, and (slowest - best) / best of its repeats."""
    import keras
    import numpy as np

    model = model_fn()
    if not model.compiled:
        model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(per_replica_batch, *i.shape[1:])).astype("float32") for i in model.inputs]
    y = [rng.normal(size=(per_replica_batch, *o.shape[1:])).astype("float32")
         for o in model.outputs]
    if isinstance(model.loss, str) and "sparse" in model.loss or \
            isinstance(model.loss, keras.losses.SparseCategoricalCrossentropy):
        y = [rng.integers(0, o.shape[-1], size=(per_replica_batch,)) for o in model.outputs]
    x, y = (x[0] if len(x) == 1 else x), (y[0] if len(y) == 1 else y)
    for _ in range(3):  # trace and warm up
        model.train_on_batch(x, y)
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            model.train_on_batch(x, y)
        timings.append((time.perf_counter() - started) / steps)
    return min(timings), (max(timings) - min(timings)) / min(timings)


# ------------------------------------------------------------------------------- the plan
@dataclasses.dataclass
class Estimate:
    per_replica_batch: int
    t1: float
    t2: float
    step: float
    throughput: float  # examples per second, all replicas
    efficiency: float  # t1 / step
    spread: float = 0.0  # of t1's timings: (slowest - best) / best


def estimate(per_replica_batch: int, t1: float, t2: float, replicas: int,
             overlap: bool = False, spread: float = 0.0) -> Estimate:
    step = max(t1, t2) if overlap else t1 + t2
    return Estimate(per_replica_batch, t1, t2, step, replicas * per_replica_batch / step,
                    t1 / step, spread)


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
        """Measurements to distrust: a t1 that falls as the batch grows (beyond the spread)."""
        found = []
        for smaller, larger in zip(self.estimates, self.estimates[1:]):
            if larger.t1 * (1 + max(smaller.spread, larger.spread)) < smaller.t1:
                found.append(f"t1 falls from {smaller.t1 * 1e3:.2f} ms at batch "
                             f"{smaller.per_replica_batch} to {larger.t1 * 1e3:.2f} ms at "
                             f"{larger.per_replica_batch}: the smaller batch's timing is noise or a "
                             "per-step cost (re-run on an idle machine; trust the larger batches)")
        return found

    def learning_rate_advice(self, base_batch: int) -> str:
        """The linear scaling rule from a learning rate tuned at batch `base_batch`."""
        global_batch = self.replicas * self.recommended.per_replica_batch
        return (f"global batch {global_batch}: learning rate = the one tuned at batch {base_batch} "
                f"x {global_batch / base_batch:g} (linear rule, kdist.scale_learning_rate), warmed "
                "up over the first epoch (kdist.LinearWarmup)")

    def table(self) -> str:
        lines = [f"replicas {self.replicas}, gradients {self.gradient_bytes / 1e6:.2f} MB, on the "
                 f"wire {self.wire_bytes / 1e6:.3f} MB per worker ({self.collective})", "",
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
                "learning_rate": self.learning_rate_advice(base_batch)}


def recommend(estimates: list[Estimate], replicas: int,
              max_global_batch: int | None = None) -> Estimate:
    """The smallest batch whose throughput is within `NEAR_BEST` of the best measured, among
    those whose global batch is at most `max_global_batch` (when none is, the smallest)."""
    allowed = [e for e in estimates if not max_global_batch
               or replicas * e.per_replica_batch <= max_global_batch] or estimates[:1]
    best = max(e.throughput for e in allowed)
    return next(e for e in allowed if e.throughput >= NEAR_BEST * best)


def plan(model_fn, per_replica_batch: int, replicas: int, bandwidth: float, latency: float = 0.0,
         compressor=None, overlap: bool = False, host_cost: float = 0.0,
         measure=measure_compute, max_global_batch: int | None = None,
         progress=lambda message: None) -> Plan:
    """Measures t1 for per-replica batches from per_replica_batch/8 to 8x and estimates each.

    `measure(model_fn, batch)` returns t1 or (t1, spread); `progress(message)` hears of each
    measurement before it starts."""
    if per_replica_batch < 1 or replicas < 1:
        raise ValueError("--per-replica-batch and --replicas must be >= 1")
    model = model_fn()
    routed = wire_bytes(model, compressor, replicas)
    t2 = sum(communication_time(payload, collective, replicas, bandwidth, latency, host_cost)
             for collective, payload in routed.items())
    batches = sorted({max(1, per_replica_batch * 2 ** k // 8) for k in range(7)})
    estimates = []
    for i, batch in enumerate(batches):
        progress(f"measuring t1 at per-replica batch {batch} ({i + 1}/{len(batches)})")
        timing = measure(model_fn, batch)
        t1, spread = timing if isinstance(timing, tuple) else (timing, 0.0)
        estimates.append(estimate(batch, t1, t2, replicas, overlap, spread))
    requested = next(e for e in estimates if e.per_replica_batch == per_replica_batch)
    return Plan(replicas, gradient_bytes(model), sum(routed.values()), " + ".join(sorted(routed)),
                estimates, requested, recommend(estimates, replicas, max_global_batch),
                max_global_batch)


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
