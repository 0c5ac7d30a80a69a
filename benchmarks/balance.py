"""Proportional batches with one slow worker: step time with an equal split vs `balance="measure"`.

    python benchmarks/balance.py [--delay-ms 0.5] [--epochs 8] [--rounds 2]

Two real MultiWorkerMirrored workers. Worker 1 is the slow device: its model starts with a layer
that sleeps `--delay-ms` per example of its batch (forward pass only; a sleep takes no CPU, so the
two workers do not fight over this machine's 2 cores, which a CPU quota made too noisy to read).
Both splits train the same MLP 64-256-256-10 from the same weights on the UCI digits (SGD 0.05,
global batch 256, `--epochs` of 4 passes over the 1,437 training digits each), one cluster per
split, the splits taking turns `--rounds` times. A step's time is the time between two consecutive
`on_train_batch_end` calls within an epoch (so each epoch's new input iterator, about 0.5 s under
MultiWorkerMirrored here, is not counted), the first epoch (tracing, and the measurement of
"measure") left out. Prints a table and saves benchmarks/results/balance.{json,md}.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import results_table

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("equal", "measure")
GLOBAL_BATCH, WIDTH, PASSES = 256, 256, 4


def job(out_path, mode, epochs, delay_ms):
    """Runs on both workers; worker 0 writes the figures."""
    import kdist

    kdist.strategy()
    import keras
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    import mnist_data

    task = kdist.cluster().task_index
    seconds_per_example = delay_ms / 1000 if task == 1 else 0.0

    class SlowDevice(keras.layers.Layer):
        """Sleeps seconds_per_example x batch size, then passes its input on."""

        def call(self, inputs):
            slept = tf.py_function(lambda n: time.sleep(float(n) * seconds_per_example) or 0.0,
                                   [tf.shape(inputs)[0]], tf.float32)
            return inputs + tf.reshape(slept, (1, 1)) * 0.0

    digits = mnist_data.load("digits")
    x, x_test = digits.x_train.reshape(-1, 64), digits.x_test.reshape(-1, 64)
    x, y = np.tile(x, (PASSES, 1)), np.tile(digits.y_train, PASSES)
    keras.utils.set_random_seed(0)
    with kdist.scope(balance=None if mode == "equal" else "measure"):
        model = keras.Sequential([keras.Input((64,)), SlowDevice(),
                                  keras.layers.Dense(WIDTH, activation="relu"),
                                  keras.layers.Dense(WIDTH, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    ends = []  # per epoch: the times at which its steps ended
    clock = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: ends.append([]),
        on_train_batch_end=lambda batch, logs: ends[-1].append(time.perf_counter()))
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, callbacks=[clock],
              verbose=0)
    accuracy = model.evaluate(x_test, digits.y_test, verbose=0, return_dict=True)["accuracy"]
    if task == 0:
        with open(out_path, "w") as f:
            json.dump({"mode": mode, "step_seconds": [[b - a for a, b in zip(e, e[1:])]
                                                       for e in ends],
                       "shares": kdist.balance.shares_of(model), "test_accuracy": accuracy}, f)


def run_cluster(mode, args) -> dict:
    from kdist.cluster import ClusterSpec
    from kdist.launch import Launcher

    spec = ClusterSpec.local_layout({"worker": 2})
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "run.json")
        command = [sys.executable, os.path.abspath(__file__), "--job-out", out, "--mode", mode,
                   "--epochs", str(args.epochs), "--delay-ms", str(args.delay_ms)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        with open(os.devnull, "w") as quiet:
            code = Launcher(spec, command, timeout=900, output=quiet, env=env).run()
        if code != 0:
            sys.exit(f"the {mode} cluster failed with exit code {code}")
        return json.load(open(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay-ms", type=float, default=0.5, help="worker 1's delay per example")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job_out:
        return job(args.job_out, args.mode, args.epochs, args.delay_ms)

    runs = [run_cluster(mode, args) for _ in range(args.rounds) for mode in MODES]
    step_ms = {mode: [1000 * s for run in runs if run["mode"] == mode
                      for epoch in run["step_seconds"][1:] for s in epoch] for mode in MODES}
    equal = statistics.median(step_ms["equal"])
    lines = ["| split | shares (worker 0, worker 1) | step time, ms (median) | range | speed-up "
             "vs equal | test accuracy |", "|---|---|---|---|---|---|"]
    for mode in MODES:
        mine = [run for run in runs if run["mode"] == mode]
        shares = "; ".join(", ".join(f"{s:.2f}" for s in run["shares"] or (0.5, 0.5))
                           for run in mine)
        median = statistics.median(step_ms[mode])
        accuracy = ", ".join(f"{run['test_accuracy']:.4f}" for run in mine)
        lines.append(f"| {'equal (Keras)' if mode == 'equal' else 'balance=measure'} | {shares} | "
                     f"{median:.1f} | {min(step_ms[mode]):.1f}-{max(step_ms[mode]):.1f} | "
                     f"{equal / median:.2f} | {accuracy} |")
    results_table.save(
        "balance",
        f"MultiWorkerMirrored, 2 workers on {os.cpu_count()} CPU cores, worker 1 slowed by "
        f"{args.delay_ms} ms per example of its batch; MLP 64-{WIDTH}-{WIDTH}-10 on the UCI digits, "
        f"global batch {GLOBAL_BATCH}, {args.epochs} epochs of {PASSES} passes per cluster, "
        f"{args.rounds} cluster(s) per split; a step's time is between two consecutive batch ends "
        "(first epoch of each cluster not counted).\n\n" + "\n".join(lines),
        {"delay_ms": args.delay_ms, "runs": runs})


if __name__ == "__main__":
    main()
