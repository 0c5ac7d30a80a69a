"""Data, model and hybrid parallelism side by side: memory per device and step time.

    python benchmarks/parallelism.py [--hidden 4096] [--epochs 4] [--rounds 2]

One MLP 1024 -> hidden -> 1024 -> 10 (SGD with momentum, global batch 256, random data), trained
the way a Keras user trains it, four ways; the processes of each run are fresh:

- one device: plain Keras, one process, no strategy (the baseline);
- data parallel: MultiWorkerMirrored, 2 worker processes x 1 device, plain Dense layers;
- model parallel: one process whose CPU is split into 2 logical devices, the two big layers split
  by a Keras `LayoutMap` (column, then row) with `kdist.layers.from_layout_map`;
- hybrid: MultiWorkerMirrored, 2 workers x 2 logical devices each, the same `LayoutMap`.

Memory per device is read from where TensorFlow placed each variable (weights and optimizer
slots). A step's time is between two consecutive `on_train_batch_end` calls within an epoch, the
first epoch (tracing) left out. All processes share this machine's cores, so the step times show
what each layout costs here, not what separate hosts or GPUs would gain. Prints a table and saves
benchmarks/results/parallelism.{json,md}.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import results_table

LAYOUTS = {  # name -> (worker processes, logical devices per process, split by the LayoutMap)
    "one device": (1, 1, False),
    "data parallel": (2, 1, False),
    "model parallel": (1, 2, True),
    "hybrid": (2, 2, True),
}
GLOBAL_BATCH, FEATURES, STEPS_PER_EPOCH = 256, 1024, 12


def job(out_path, layout, hidden, epochs):
    """Trains one layout; the first process writes the figures."""
    import kdist

    workers, devices_count, split = LAYOUTS[layout]
    devices = kdist.split_cpu(devices_count) if devices_count > 1 else None
    if workers > 1:
        kdist.strategy()  # MultiWorkerMirrored, before any other TensorFlow op
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS_PER_EPOCH, FEATURES)).astype("float32")
    y = rng.integers(0, 10, len(x)).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    scope = kdist.scope() if workers > 1 else tf.distribute.get_strategy().scope()
    with scope:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(hidden, activation="relu", name="up"),
                                  keras.layers.Dense(FEATURES, activation="relu", name="down"),
                                  keras.layers.Dense(10, name="head")])
        if split:
            mesh = keras.distribution.DeviceMesh((1, devices_count), ["batch", "model"], devices)
            layout_map = keras.distribution.LayoutMap(mesh)
            layout_map[".*up/kernel"], layout_map[".*down/kernel"] = (None, "model"), ("model", None)
            model = kdist.layers.from_layout_map(model, layout_map)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ends = []
    clock = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: ends.append([]),
        on_train_batch_end=lambda batch, logs: ends[-1].append(time.perf_counter()))
    model.fit(dataset, epochs=epochs, callbacks=[clock], verbose=0)
    if kdist.cluster().task_index in (None, 0):
        with open(out_path, "w") as f:
            json.dump({"layout": layout, "bytes_per_device": bytes_per_device(model),
                       "step_seconds": [[b - a for a, b in zip(e, e[1:])] for e in ends[1:]]}, f)


def bytes_per_device(model) -> dict[str, int]:
    """Bytes of the weights and optimizer slots each of this process's devices holds."""
    held = {}
    for variable in [*model.weights, *model.optimizer.variables]:
        for value in getattr(variable.value, "values", [variable.value]):
            device = value.device.rsplit("/", 1)[-1].replace("device:", "")
            held[device] = held.get(device, 0) + value.numpy().nbytes
    return held


def run(layout, args) -> dict:
    from kdist.cluster import ClusterSpec
    from kdist.launch import Launcher

    workers = LAYOUTS[layout][0]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "run.json")
        command = [sys.executable, os.path.abspath(__file__), "--job-out", out, "--layout", layout,
                   "--hidden", str(args.hidden), "--epochs", str(args.epochs)]
        if workers == 1:
            subprocess.run(command, check=True, timeout=900, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        else:
            with open(os.devnull, "w") as quiet:
                code = Launcher(ClusterSpec.local_layout({"worker": workers}), command,
                                timeout=900, output=quiet, env=env).run()
            if code != 0:
                sys.exit(f"the {layout} cluster failed with exit code {code}")
        return json.load(open(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    parser.add_argument("--layout", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job_out:
        return job(args.job_out, args.layout, args.hidden, args.epochs)

    runs = [run(layout, args) for _ in range(args.rounds) for layout in LAYOUTS]
    lines = ["| layout | processes x devices | MB per device (weights + slots) | step time, ms "
             "(median) | range | vs one device |", "|---|---|---|---|---|---|"]
    rows, base = {}, None
    for layout, (workers, devices_count, _) in LAYOUTS.items():
        steps = [1000 * s for r in runs if r["layout"] == layout for e in r["step_seconds"]
                 for s in e]
        memory = runs[[r["layout"] for r in runs].index(layout)]["bytes_per_device"]
        median = statistics.median(steps)
        base = base or median
        rows[layout] = {"median_ms": median, "bytes_per_device": memory}
        per_device = ", ".join(f"{d}: {n / 2**20:.1f}" for d, n in sorted(memory.items()))
        lines.append(f"| {layout} | {workers} x {devices_count} | {per_device} | {median:.1f} | "
                     f"{min(steps):.1f}-{max(steps):.1f} | {median / base:.2f} |")
    results_table.save(
        "parallelism",
        f"MLP {FEATURES}-{args.hidden}-{FEATURES}-10, SGD with momentum, global batch "
        f"{GLOBAL_BATCH}, {STEPS_PER_EPOCH} steps per epoch, {args.epochs} epochs per run (the "
        f"first not counted), {args.rounds} runs per layout taking turns; {os.cpu_count()} CPU "
        "cores shared by every process and logical device; MB per device read from where each "
        "variable was placed (per process: every worker holds the same).\n\n" + "\n".join(lines),
        {"hidden": args.hidden, "epochs": args.epochs, "runs": runs, "summary": rows})


if __name__ == "__main__":
    main()
