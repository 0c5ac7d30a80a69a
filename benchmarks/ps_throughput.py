"""Parameter-server training throughput and staleness for 1 and 2 workers (chief + N workers + 2 ps).

    python benchmarks/ps_throughput.py [--workers 1,2] [--steps 200] [--epochs 3]

Each configuration is a real local cluster (`kdist.launch.Launcher`), run one after the other in
this one invocation. The chief trains an MLP 784-256-256-10 (first kernel split over the 2 ps) on
synthetic MNIST-shaped data, batch 64 per step, and times the epochs after the first (tracing and
start-up excluded). Staleness of a step = updates other workers applied between the step reading
`optimizer.iterations` and applying its own gradient. Prints a table and saves
benchmarks/results/ps_throughput.{json,md}.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import results_table


def job(out_path, steps, epochs):
    """Runs on every task of the cluster; the chief measures."""
    import kdist

    kdist.strategy()  # ps and workers serve here and exit when the chief is done
    import keras
    import numpy as np
    from keras import ops

    class StalenessProbe(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.staleness = keras.metrics.Mean(name="staleness")

        def train_step(self, data):
            read_at = ops.cast(ops.convert_to_tensor(self.optimizer.iterations), "float32")
            logs = super().train_step(data)
            applied = ops.cast(ops.convert_to_tensor(self.optimizer.iterations), "float32")
            self.staleness.update_state(applied - read_at - 1.0)
            return logs

    rng = np.random.default_rng(0)
    x = rng.random((8192, 784), dtype=np.float32)
    y = rng.integers(0, 10, size=8192).astype("int32")
    with kdist.scope():
        inputs = keras.Input((784,))
        hidden = kdist.layers.PartitionedDense(256, activation="relu")(inputs)
        hidden = keras.layers.Dense(256, activation="relu")(hidden)
        model = StalenessProbe(inputs, keras.layers.Dense(10)(hidden))
        model.compile(keras.optimizers.SGD(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class EpochTimer(keras.callbacks.Callback):
        seconds, staleness = [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):  # after coordinator.join(): all steps done
            self.seconds.append(time.perf_counter() - self.started)
            self.staleness.append(logs["staleness"])

    timer = EpochTimer()
    model.fit(x, y, batch_size=64, epochs=epochs, steps_per_epoch=steps, verbose=0,
              callbacks=[timer])
    measured = timer.seconds[1:]
    with open(out_path, "w") as f:
        json.dump({"workers": kdist.cluster().roles["worker"], "steps_per_epoch": steps,
                   "epoch_seconds": timer.seconds,
                   "steps_per_second": steps * len(measured) / sum(measured),
                   "mean_staleness": sum(timer.staleness[1:]) / len(measured)}, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job_out:
        return job(args.job_out, args.steps, args.epochs)

    from kdist.cluster import ClusterSpec
    from kdist.launch import Launcher

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for workers in (int(n) for n in args.workers.split(",")):
            out = os.path.join(scratch, f"{workers}.json")
            spec = ClusterSpec.local_layout({"chief": 1, "worker": workers, "ps": 2})
            command = [sys.executable, os.path.abspath(__file__), "--job-out", out,
                       "--steps", str(args.steps), "--epochs", str(args.epochs)]
            env = dict(os.environ, KDIST_CHIEF_GRACE="2", TF_CPP_MIN_LOG_LEVEL="2")
            with open(os.devnull, "w") as quiet:
                code = Launcher(spec, command, timeout=900, output=quiet, env=env).run()
            if code != 0:
                sys.exit(f"cluster with {workers} worker(s) failed with exit code {code}")
            rows.append(json.load(open(out)))
    baseline = rows[0]["steps_per_second"]
    lines = ["| workers | steps/s | examples/s | speed-up vs first row | mean staleness (updates) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['workers']} | {r['steps_per_second']:.1f} | {64 * r['steps_per_second']:.0f} | "
              f"{r['steps_per_second'] / baseline:.2f} | {r['mean_staleness']:.2f} |" for r in rows]
    results_table.save("ps_throughput",
                       f"Measured on {os.cpu_count()} CPU cores, chief + N workers + 2 ps on "
                       f"loopback, {args.steps} steps/epoch, batch 64.\n\n" + "\n".join(lines),
                       {"machine": f"{os.cpu_count()} CPU cores", "rows": rows})


if __name__ == "__main__":
    main()
