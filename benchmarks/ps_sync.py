"""Parameter-server synchronisation modes with one slow worker: time to accuracy and staleness.

    python benchmarks/ps_sync.py [--target 0.95] [--max-epochs 12] [--runs 3]

One real local cluster (chief + 3 workers + 2 ps). A process started by the chief throttles
worker 2 for the whole run: SIGSTOP for `--slow-fraction` of every 40 ms, SIGCONT for the rest (a
CPU quota, done with signals), so it computes about 1 / (1 - fraction) times slower. For each `ps_sync` mode it trains
the same MLP 64-256-256-10 from the same weights on the UCI digits (SGD 0.05, momentum 0.9, batch
32, one epoch = 1437 / 32 steps), evaluating after each epoch, until the test accuracy reaches
`--target`; `--runs` times per mode, the modes taking turns (the table shows the median and every
run: the order in which asynchronous updates land differs from run to run). ``kbatch:1`` is asynchronous SGD through the critical section, there for its
staleness histogram (plain ``async`` records none). Prints a table and saves
benchmarks/results/ps_sync.{json,md,png}.
"""

import argparse
import json
import os
import signal
import sys
import subprocess
import tempfile
import time

import results_table

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("async", "kbatch:1", "ksync:3", "ksync:2", "kbatch:2", "stale:1")
PERIOD = 0.04


def throttle(pid, fraction):
    """SIGSTOP `pid` for `fraction` of every PERIOD until this process is terminated, then SIGCONT
    it. A process of its own: a thread of the chief can wait for the GIL while the chief waits in
    TensorFlow for the stopped worker."""
    resume = lambda *_: (os.kill(pid, signal.SIGCONT), sys.exit(0))  # noqa: E731
    signal.signal(signal.SIGTERM, resume)
    while True:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(PERIOD * fraction)
        os.kill(pid, signal.SIGCONT)
        time.sleep(PERIOD * (1 - fraction))


def job(out_path, target, max_epochs, fraction, runs):
    """Runs on every task of the cluster; the chief measures."""
    import kdist

    kdist.strategy()  # ps and workers serve here and exit when the chief is done
    import psutil

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    import mnist_data

    digits = mnist_data.load("digits")
    x, x_test = digits.x_train.reshape(-1, 64), digits.x_test.reshape(-1, 64)
    slow_config = kdist.cluster().tf_config_json("worker", 2)
    slow = next(p for p in psutil.process_iter() if _environ(p).get("TF_CONFIG") == slow_config)
    throttler = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--throttle",
                                  str(slow.pid), "--slow-fraction", str(fraction)])
    rows = {mode: [] for mode in MODES}
    try:
        for _ in range(runs):  # the modes take turns, so that a slow spell of the machine is shared
            for mode in MODES:
                rows[mode].append(train(mode, x, digits.y_train, x_test, digits.y_test, target,
                                        max_epochs))
                print(mode, rows[mode][-1], flush=True)
    finally:
        throttler.terminate()
        throttler.wait(timeout=10)
    with open(out_path, "w") as f:
        json.dump(rows, f)


def train(mode, x, y, x_test, y_test, target, max_epochs) -> dict:
    import keras

    import kdist

    keras.utils.set_random_seed(0)
    with kdist.scope(ps_sync=mode):
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    steps = len(x) // 32
    histogram, applied, dropped, accuracy, epochs = None, 0, 0, 0.0, 0
    started = time.perf_counter()
    while accuracy < target and epochs < max_epochs:
        model.fit(x, y, batch_size=32, epochs=1, steps_per_epoch=steps, verbose=0)
        epochs += 1
        accuracy = model.evaluate(x_test, y_test, batch_size=120, verbose=0)[1]
        if mode != "async":
            stats = kdist.ps.sync_stats(model)
            histogram = [a + b for a, b in zip(histogram or [0] * len(stats["staleness_histogram"]),
                                               stats["staleness_histogram"])]
            applied += stats["ps_gradients_applied"]
            dropped += stats["ps_gradients_dropped"]
    return {"seconds_to_target": time.perf_counter() - started if accuracy >= target else None,
            "epochs": epochs, "accuracy": accuracy, "updates": int(model.optimizer.iterations.numpy()),
            "gradients_applied": applied, "gradients_dropped": dropped,
            "staleness_histogram": histogram}


def _environ(process) -> dict:
    import psutil

    try:
        return process.environ()
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        return {}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--max-epochs", type=int, default=12)
    parser.add_argument("--slow-fraction", type=float, default=0.75)
    parser.add_argument("--runs", type=int, default=3, help="trainings per mode (median shown)")
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    parser.add_argument("--throttle", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.throttle:
        return throttle(args.throttle, args.slow_fraction)
    if args.job_out:
        return job(args.job_out, args.target, args.max_epochs, args.slow_fraction, args.runs)

    from kdist.cluster import ClusterSpec
    from kdist.launch import Launcher

    spec = ClusterSpec.local_layout({"chief": 1, "worker": 3, "ps": 2})
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "rows.json")
        command = [sys.executable, os.path.abspath(__file__), "--job-out", out,
                   "--target", str(args.target), "--max-epochs", str(args.max_epochs),
                   "--slow-fraction", str(args.slow_fraction), "--runs", str(args.runs)]
        env = dict(os.environ, KDIST_CHIEF_GRACE="2", TF_CPP_MIN_LOG_LEVEL="2")
        code = Launcher(spec, command, timeout=1800, env=env).run()
        if code != 0:
            sys.exit(f"the cluster failed with exit code {code}")
        rows = json.load(open(out))
    lines = ["| ps_sync | seconds to target: median (each run) | epochs (median) | updates "
             "(median) | gradients applied | dropped | staleness of applied gradients: 0 / 1 / "
             "2 / 3+ |", "|---|---|---|---|---|---|---|"]
    for mode, runs in rows.items():
        lines.append(row_line(mode, runs))
    folder = results_table.save(
        "ps_sync",
        f"UCI digits, MLP 64-256-256-10, SGD 0.05 momentum 0.9, batch 32, chief + 3 workers + "
        f"2 ps on {os.cpu_count()} CPU cores, worker 2 stopped {args.slow_fraction:.0%} of every "
        f"{PERIOD * 1000:.0f} ms; time until the test accuracy reaches {args.target} (evaluated "
        f"after each epoch, at most {args.max_epochs} epochs), {args.runs} trainings per mode "
        "taking turns; counts summed over them.\n\n"
        + "\n".join(lines), {"machine": f"{os.cpu_count()} CPU cores", "rows": rows})
    plot(rows, os.path.join(folder, "ps_sync.png"), args.target)


def seconds(run):
    return run["seconds_to_target"] if run["seconds_to_target"] is not None else float("inf")


def row_line(mode, runs) -> str:
    import statistics

    times = [seconds(run) for run in runs]
    shown = ", ".join("not reached" if t == float("inf") else f"{t:.1f}" for t in times)
    median = statistics.median(times)
    histogram = [sum(column) for column in zip(*(run["staleness_histogram"] or [] for run in runs))]
    spread = (" / ".join(str(n) for n in histogram[:3] + [sum(histogram[3:])]) if histogram
              else "not recorded")
    counts = (f"{sum(r['gradients_applied'] for r in runs):.0f} | "
              f"{sum(r['gradients_dropped'] for r in runs):.0f}" if histogram else "all | 0")
    return (f"| {mode} | {'not reached' if median == float('inf') else f'{median:.1f}'} "
            f"({shown}) | {statistics.median(r['epochs'] for r in runs):.0f} | "
            f"{statistics.median(r['updates'] for r in runs):.0f} | {counts} | {spread} |")


def plot(rows, path, target):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    import statistics

    names = list(rows)
    medians = [statistics.median(seconds(run) for run in rows[n]) for n in names]
    left.bar(names, [0 if m == float("inf") else m for m in medians])
    for k, name in enumerate(names):
        reached = [seconds(run) for run in rows[name] if run["seconds_to_target"] is not None]
        left.scatter([k] * len(reached), reached, color="black", s=12, zorder=3)
    left.set_ylabel(f"seconds to {target} accuracy (bar: median, dots: runs)")
    left.set_title("time to accuracy, one worker throttled")
    left.tick_params(axis="x", rotation=30)
    for name in names:
        histogram = [sum(c) for c in zip(*(r["staleness_histogram"] or [] for r in rows[name]))]
        if histogram and sum(histogram):
            right.plot(range(len(histogram)), [n / sum(histogram) for n in histogram],
                       marker="o", label=name)
    right.set_xlabel("staleness of an applied gradient (updates; last bucket: this or more)")
    right.set_ylabel("fraction of applied gradients")
    right.set_title("staleness")
    right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
