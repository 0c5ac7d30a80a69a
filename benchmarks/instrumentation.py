"""What kdist's always-on instrumentation costs under MultiWorkerMirrored: the step clock and the
hang watchdog (every step) and the replica check (every epoch), on the peers benchmark's model.

    python benchmarks/instrumentation.py [--rounds 6] [--steps 40]

2 workers started by `kdist launch`, each pinned to one core with one TensorFlow thread
(benchmarks/measure.py), MLP 784-1024-1024-10 (1,863,690 parameters, as benchmarks/peers.py),
per-worker batch 128, plain SGD. Timing two fits side by side on these 2 shared cores moves by
several percent from round to round, more than the 1% to be checked, so the cost is counted where
it is spent, in the instrumented fits:

- per step: the three clock readings inside the step (each a timestamp behind one value of every
  tensor it times: timed alone, in a tf.function of the same tensors whose every result is used,
  per call, against the same function without them), the Python of the two batch callbacks, and
  the watchdog thread's CPU time, all divided by the steps;
- per epoch: the wall time of the replica check (its first call, which traces, apart), against an
  epoch of 60,000 examples (one MNIST pass) at the global batch, from the median step.

Rounds alternate fits with the instrumentation on and off; their median steps are shown too, as a
check that nothing else moved. Prints a table and saves benchmarks/results/instrumentation.{json,md}.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import results_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INPUTS, HIDDEN, CLASSES = 784, 1024, 10
EPOCH_EXAMPLES = 60_000


class Ledger:
    """Seconds spent in kdist's per-step Python and in the watchdog thread, and the replica
    check's calls, counted by wrapping them in this process."""

    def __init__(self):
        from kdist import replicas
        from kdist.steps import callback, watchdog

        self.python, self.watchdog_cpu, self.checks = 0.0, 0.0, []
        ledger = self

        def timed(function):
            def wrapper(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    ledger.python += time.perf_counter() - started
            return wrapper

        callback.StepWatch.on_train_batch_begin = timed(callback.StepWatch.on_train_batch_begin)
        callback.StepWatch.on_train_batch_end = timed(callback.StepWatch.on_train_batch_end)
        run = watchdog.Watchdog.run

        def counted_run(thread):
            try:
                run(thread)
            finally:
                ledger.watchdog_cpu += time.thread_time()

        watchdog.Watchdog.run = counted_run
        check = replicas.check_replicas

        def timed_check(*args, **kwargs):
            started = time.perf_counter()
            try:
                return check(*args, **kwargs)
            finally:
                ledger.checks.append(time.perf_counter() - started)

        replicas.check_replicas = timed_check

    def take(self) -> dict:
        time.sleep(1.0)  # the watchdog of the fit that ended has stopped and counted itself
        taken = {"python": self.python, "watchdog_cpu": self.watchdog_cpu, "checks": self.checks}
        self.python, self.watchdog_cpu, self.checks = 0.0, 0.0, []
        return taken


def model():
    import keras

    keras.utils.set_random_seed(0)
    built = keras.Sequential([keras.Input((INPUTS,)), keras.layers.Dense(HIDDEN, "relu"),
                              keras.layers.Dense(HIDDEN, "relu"), keras.layers.Dense(CLASSES)])
    built.compile(keras.optimizers.SGD(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return built


def fit(args, instrumented: bool) -> dict:
    """One fit of 1 + `epochs` epochs; the warm epochs' step times."""
    import keras
    import kdist
    import numpy as np

    with kdist.scope(watch_steps=instrumented, check_replicas="error" if instrumented else "off"):
        built = model()
    rng = np.random.default_rng(0)
    global_batch = kdist.global_batch_size(args.batch)
    x = rng.normal(size=(global_batch * args.steps, INPUTS)).astype("float32")
    y = rng.integers(0, CLASSES, size=len(x))
    ends = []
    clock = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
    built.fit(x, y, batch_size=global_batch, epochs=1 + args.epochs, verbose=0, shuffle=False,
              callbacks=[clock])
    warm = ends[args.steps:]
    steps = [b - a for a, b in zip(warm, warm[1:])]
    return {"step": statistics.median(steps), "steps": len(warm), "global_batch": global_batch}


def readings_per_call(args) -> float:
    """Seconds the step clock's three readings add to a tf.function holding the model's tensors
    (the batch, 6 gradients, 6 sums), per call."""
    import tensorflow as tf
    from kdist.steps import clock

    shapes = [(INPUTS, HIDDEN), (HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES),
              (CLASSES,)]
    batch = tf.random.normal((args.batch, INPUTS))
    tensors = [tf.random.normal(shape) for shape in shapes]
    clock.stamps()

    def make(read):
        @tf.function
        def step(batch, tensors):
            if read:
                clock.reading(batch, "input")
            grads = [t * 2.0 for t in tensors]
            if read:
                clock.reading(grads, "gradients")
            sums = [g + 1.0 for g in grads]
            if read:
                clock.reading(sums, "summed")
            # every result used, as a step uses every gradient (else Grappler drops what the
            # readings alone would read, and they seem to cost its compute)
            return tf.add_n([tf.reduce_sum(s) for s in sums]) + tf.reduce_sum(batch)
        return step

    plain, read = make(False), make(True)
    costs = []
    for _ in range(args.rounds):
        with_readings = measure.median_seconds(lambda: read(batch, tensors).numpy(), 200)
        without = measure.median_seconds(lambda: plain(batch, tensors).numpy(), 200)
        costs.append(with_readings - without)
    return statistics.median(costs)


def worker(args):
    measure.pin_worker_to_one_core()
    import kdist

    measure.one_thread()
    kdist.strategy()
    ledger = Ledger()
    rows = {"on": [], "off": [], "ledger": []}
    for round_ in range(args.rounds):
        for instrumented in ((True, False) if round_ % 2 == 0 else (False, True)):
            timed = fit(args, instrumented)
            rows["on" if instrumented else "off"].append(timed)
            if instrumented:
                rows["ledger"].append(ledger.take())
            else:
                ledger.take()
    rows["readings_per_call"] = readings_per_call(args)
    if kdist.cluster().is_chief:
        with open(args.out, "w") as f:
            json.dump(rows, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="warm epochs per fit")
    parser.add_argument("--batch", type=int, default=128, help="per-worker batch")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.out:
        return worker(args)
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "rows.json")
        subprocess.run([sys.executable, "-m", "kdist", "launch", "--workers", "2", "--timeout",
                        "3600", "--", sys.executable, __file__, "--out", out,
                        *sys.argv[1:]], check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        rows = json.load(open(out))
    table, summary = tabulate(args, rows)
    results_table.save("instrumentation", table, {"rows": rows, "summary": summary})


def tabulate(args, rows) -> tuple[str, dict]:
    step_on = statistics.median(r["step"] for r in rows["on"])
    step_off = statistics.median(r["step"] for r in rows["off"])
    low, high = min(r["step"] for r in rows["off"]), max(r["step"] for r in rows["off"])
    steps = len(rows["on"]) * (1 + args.epochs) * args.steps  # every step of the counted fits
    python = sum(t["python"] for t in rows["ledger"]) / steps
    watchdog = sum(t["watchdog_cpu"] for t in rows["ledger"]) / steps
    readings = rows["readings_per_call"]
    per_step = readings + python + watchdog
    checks = [c for t in rows["ledger"] for c in t["checks"][1:]]  # each fit's first traces
    first = [t["checks"][0] for t in rows["ledger"] if t["checks"]]
    global_batch = rows["on"][0]["global_batch"]
    epoch = step_on * EPOCH_EXAMPLES / global_batch
    check = statistics.median(checks)
    summary = {"step_on_ms": step_on * 1e3, "step_off_ms": step_off * 1e3,
               "per_step_ms": per_step * 1e3, "per_step_share": per_step / step_on,
               "check_ms": check * 1e3, "first_check_ms": statistics.median(first) * 1e3,
               "epoch_s": epoch, "check_share": check / epoch}
    lines = [
        f"MultiWorkerMirrored, 2 workers each pinned to one of {os.cpu_count()} cores with one "
        f"TensorFlow thread; MLP {INPUTS}-{HIDDEN}-{HIDDEN}-{CLASSES} (the peers benchmark's), "
        f"per-worker batch {args.batch}, {args.rounds} rounds alternating fits with the "
        f"instrumentation on and off ({args.epochs} warm epochs of {args.steps} steps each). "
        "Costs counted where they are spent (chief process).", "",
        "| instrumentation | cost | against | share (goal <= 1%) |", "|---|---|---|---|",
        f"| step clock: 3 readings in the step | {readings * 1e3:.3f} ms per step | median step "
        f"{step_on * 1e3:.2f} ms | {readings / step_on:.2%} |",
        f"| step clock and watchdog: Python per step (the batch callbacks) | {python * 1e3:.3f} "
        f"ms per step | | {python / step_on:.2%} |",
        f"| watchdog thread's CPU | {watchdog * 1e3:.3f} ms per step | | "
        f"{watchdog / step_on:.2%} |",
        f"| **per step, in all** | **{per_step * 1e3:.3f} ms** | **{step_on * 1e3:.2f} ms** | "
        f"**{per_step / step_on:.2%}** |",
        f"| replica check, per epoch | {check * 1e3:.1f} ms (first, tracing: "
        f"{summary['first_check_ms']:.0f} ms) | an epoch of {EPOCH_EXAMPLES:,} examples: "
        f"{epoch:.1f} s | {check / epoch:.2%} |", "",
        f"Median warm step with the instrumentation on: {step_on * 1e3:.2f} ms, off: "
        f"{step_off * 1e3:.2f} ms; the rounds off alone range from {low * 1e3:.2f} to "
        f"{high * 1e3:.2f} ms, " + ("so the side-by-side difference is within this machine's "
                                    "noise, and the costs above are counted one by one."
                                    if abs(step_on - step_off) < high - low else
                                    "so the side-by-side difference is above this machine's "
                                    "noise: see the costs above.")]
    return "\n".join(lines), summary


if __name__ == "__main__":
    sys.exit(main())
