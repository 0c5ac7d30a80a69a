"""Shared by the benchmarks: time a fit and its warm steps, run contenders in rounds, and read
network interface counters."""

import json
import os
import statistics
import sys
import time


def pin_worker_to_one_core():
    """Pins this process to core (its TF_CONFIG task index mod the core count), before TF starts
    any thread; `one_thread` then keeps TF to one op at a time. Two workers on a 2-core machine
    stop trading cores between rounds, which is most of the round-to-round noise."""
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    os.sched_setaffinity(0, {index % os.cpu_count()})


def one_thread(inter_op: int = 1):
    """One CPU thread for each op's math; `inter_op` threads to run ops side by side (e.g. a
    collective's ring steps next to a backward matmul)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def run_on_shaped_link(hosts, rate, command, out_path, port, timeout) -> dict:
    """Runs `command` as one worker per host, each in a network namespace of its own whose link
    `tc` shapes to `rate` (`kdist.k8s.netlab`); returns the JSON the chief wrote to `out_path`."""
    from kdist.k8s import netlab

    with netlab.Network(hosts, rate=rate) as network:
        network.run_workers(command, port, timeout)
    with open(out_path) as f:
        return json.load(f)


def local_job(command: list, workers: int, out_path: str, name: str, env=None,
              timeout: float = 900) -> dict:
    """Runs `command` as `workers` local workers (`kdist.launch.Launcher`, 127.0.0.1, with `env`)
    and returns the JSON it wrote to `out_path`; a failed job ends the benchmark, naming `name`."""
    from kdist.cluster.spec import ClusterSpec
    from kdist.launch import Launcher

    code = Launcher(ClusterSpec.local_layout({"worker": workers}), command, timeout=timeout,
                    env=env).run()
    if code:
        sys.exit(f"{name} on {workers} worker(s) failed ({code})")
    with open(out_path) as f:
        return json.load(f)


def timed_fit(model, x, y, epochs: int, **fit_arguments) -> tuple[dict, object]:
    """`model.fit(x, y, epochs=epochs, ...)` timed: ({"fit_s": the whole fit, "warm_step_ms": the
    median step after the first epoch}, its History)."""
    import keras

    steps, began = [], []
    timer = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda *_, **__: began.append(time.perf_counter()),
        on_train_batch_end=lambda *_, **__: steps.append(time.perf_counter() - began[-1]))
    start = time.perf_counter()
    history = model.fit(x, y, epochs=epochs, verbose=0,
                        callbacks=[*fit_arguments.pop("callbacks", []), timer], **fit_arguments)
    fit_s = time.perf_counter() - start
    warm = steps[len(steps) // epochs:]
    return {"fit_s": fit_s, "warm_step_ms": 1000 * statistics.median(warm)}, history


def write_task_report(out_path: str, report: dict) -> None:
    """Writes this task's `report` to OUT_PATH.INDEX (its TF_CONFIG index; 0 alone)."""
    index = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
    with open(f"{out_path}.{index}", "w") as f:
        json.dump(report, f)


def fit_on_two_workers(script: str, out: str, flags: list, name: str) -> dict:
    """`python SCRIPT --train OUT *FLAGS` as a job of 2 local workers, each writing its
    `timed_fit` report (with its "last_loss") to OUT.INDEX: the slower worker's whole fit and
    warm step, worker 0's last loss."""
    local_job([sys.executable, script, "--train", out, *flags], 2, out + ".0", name)
    reports = []
    for index in (0, 1):
        with open(f"{out}.{index}") as f:
            reports.append(json.load(f))
    return {"fit_s": max(r["fit_s"] for r in reports),
            "warm_step_ms": max(r["warm_step_ms"] for r in reports),
            "last_loss": reports[0]["last_loss"]}


def fit_table(title: str, column: str, medians: dict) -> str:
    """The medians of `fit_on_two_workers` runs per contender as a Markdown table under `title`,
    each warm step against the first contender's."""
    first = next(iter(medians))
    base = medians[first]["warm_step_ms"]
    header = f"| {column} | whole fit | warm step | step vs {first} | last epoch's loss |"
    lines = [title, "", header, "|---|---|---|---|---|"]
    lines += [f"| {contender} | {m['fit_s']:.1f} s | {m['warm_step_ms']:.1f} ms | "
              f"{m['warm_step_ms'] / base:.3f}x | {m['last_loss']:.4f} |"
              for contender, m in medians.items()]
    return "\n".join(lines)


def in_rounds(contenders, rounds: int, run) -> tuple[dict, dict]:
    """`run(contender, folder)` for each contender in turn, `rounds` times (a temporary folder):
    (every run's dict by contender, the medians of each of its keys)."""
    import tempfile

    runs = {contender: [] for contender in contenders}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            for contender in contenders:
                runs[contender].append(run(contender, folder))
    medians = {c: {k: statistics.median(r[k] for r in done) for k in done[0]}
               for c, done in runs.items()}
    return runs, medians


def warm_step_times(model, global_batch: int, steps: int, callbacks=()) -> list[float]:
    """Fits `model` (64 inputs, 10 classes) for 2 epochs of `steps` steps on random data (with
    `callbacks`); returns the step times of the second epoch (traced and warm)."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch * steps, 64)).astype("float32")
    y = rng.integers(0, 10, size=(global_batch * steps,))
    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            times.append(time.perf_counter())

    model.fit(x, y, batch_size=global_batch, epochs=2, verbose=0, shuffle=False,
              callbacks=[*callbacks, Clock()])
    return [float(t) for t in np.diff(times[steps:])]


def interface_bytes(interface: str, direction: str) -> int:
    """Bytes `interface` has received ("rx") or sent ("tx"), from /proc/net/dev."""
    column = {"rx": 0, "tx": 8}[direction]
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == interface:
                return int(counters.split()[column])
    raise RuntimeError(f"no interface {interface} in this network namespace")


def median_seconds(function, repeats: int = 15) -> float:
    """The median wall time of `repeats` calls of `function`, after one warm-up call."""
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# The package each peer contender needs besides kdist's own (peers.py, fit_wall.py).
PEER_PACKAGES = {"tf_keras": "tf_keras", "pytorch ddp": "torch"}


def installed(contender: str, benchmark: str) -> bool:
    """Whether `contender`'s package is installed; if not, says so (naming `benchmark`) and how
    to measure it."""
    import importlib.util

    package = PEER_PACKAGES.get(contender)
    if package is None or importlib.util.find_spec(package) is not None:
        return True
    print(f"{benchmark}: {contender} left out: `pip install {package}` to measure it",
          file=sys.stderr)
    return False
