"""ModelParallelDense versus keras.layers.Dense: training step time and kernel bytes per device.

    python benchmarks/model_parallel_dense.py [--devices 2,4] [--hidden 4096] [--steps 30]

For each device count a fresh process splits the CPU into that many logical devices and trains,
alternating, a column->row ModelParallelDense pair and the same two layers as plain Dense (which
TensorFlow runs on one device), on the same data. Prints a table and saves
benchmarks/results/model_parallel_dense.{json,md}. On CPU the logical devices share the same
cores: the figures show the overhead of splitting, not a speed-up; the memory column is the point.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import results_table


def measure(devices_count, hidden, steps):
    import kdist

    devices = kdist.split_cpu(devices_count)
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 1024)).astype("float32")
    y = rng.normal(size=(256, 1024)).astype("float32")

    def model(split):
        if split:
            layers = [kdist.layers.ModelParallelDense(hidden, devices=devices, gather_output=False,
                                                      activation="relu"),
                      kdist.layers.ModelParallelDense(1024, devices=devices, partition="row",
                                                      input_is_split=True)]
        else:
            layers = [keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(1024)]
        m = keras.Sequential([keras.Input((1024,)), *layers])
        m.compile(keras.optimizers.SGD(0.01), "mse")
        m.train_on_batch(x, y)  # trace
        return m

    models = {"dense": model(False), "model_parallel": model(True)}
    seconds = {name: [] for name in models}
    for _ in range(steps):  # alternate so both see the same machine state
        for name, m in models.items():
            started = time.perf_counter()
            m.train_on_batch(x, y)
            seconds[name].append(time.perf_counter() - started)
    return {"devices": devices_count, "hidden": hidden,
            "dense_ms": 1000 * sorted(seconds["dense"])[steps // 2],
            "model_parallel_ms": 1000 * sorted(seconds["model_parallel"])[steps // 2],
            "dense_kernel_bytes_per_device": kernel_bytes_by_device(models["dense"]),
            "model_parallel_kernel_bytes_per_device":
                kernel_bytes_by_device(models["model_parallel"])}


def kernel_bytes_by_device(model) -> dict[str, int]:
    """Bytes of the kernels each device holds, read from where TF placed each variable."""
    held = {}
    for variable in model.trainable_variables:
        if "kernel" in variable.path:
            device = variable.value.device
            held[device] = held.get(device, 0) + variable.value.numpy().nbytes
    return held


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="2,4")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.hidden, args.steps)))
        return
    rows = []
    for count in (int(n) for n in args.devices.split(",")):
        out = subprocess.run([sys.executable, __file__, "--measure", str(count), "--hidden",
                              str(args.hidden), "--steps", str(args.steps)], check=True,
                             capture_output=True, text=True, timeout=1200,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    lines = [f"Column->row pair 1024 -> {args.hidden} -> 1024, batch 256, SGD, median of "
             f"{args.steps} steps, {os.cpu_count()} CPU cores split into logical devices; "
             "kernel bytes read from the device of each placed variable.", "",
             "| devices | Dense ms/step | ModelParallelDense ms/step | ratio | Dense kernel MB per "
             "device | ModelParallelDense kernel MB per device |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['devices']} | {r['dense_ms']:.1f} | {r['model_parallel_ms']:.1f} | "
              f"{r['model_parallel_ms'] / r['dense_ms']:.2f} | "
              f"{_megabytes(r['dense_kernel_bytes_per_device'])} | "
              f"{_megabytes(r['model_parallel_kernel_bytes_per_device'])} |" for r in rows]
    results_table.save("model_parallel_dense", "\n".join(lines), rows)


def _megabytes(by_device: dict[str, int]) -> str:
    return ", ".join(f"{device.rsplit('/', 1)[-1].replace('device:', '')}: {n / 2**20:.1f}"
                     for device, n in sorted(by_device.items()))


if __name__ == "__main__":
    main()
