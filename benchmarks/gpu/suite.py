"""The GPU figures, on a GPU host (after `kdist bundle install` where it has no package index).

    python benchmarks/gpu/suite.py [--sizes 1,4,16,64] [--steps 30]

In one process, GPU 0 split into 2 logical GPUs before TensorFlow starts:

1. NCCL all-reduce of float32 tensors of each size (millions of elements) between the 2 logical
   GPUs, against the device's own copy bandwidth (a device-to-device copy of the same bytes,
   counting bytes read and written): time, algorithm bandwidth and the ratio;
2. a training step of the benchmark MLP (784-1024-1024-10) under Mirrored over the 2 logical
   GPUs, float32 / mixed_float16 / mixed_bfloat16, each without compression and with FP16 and
   PowerSGD rank 4: median step time and the ratio to the uncompressed float32 step;
3. the same step with jit_compile=True.

Each measurement alternates with its baseline and reports the median of `--steps` warm steps.
Prints tables and saves benchmarks/results/gpu.{json,md} with the machine (GPU name, driver) and
versions. Logical GPUs share one device: the collectives' figures measure NCCL's intra-device
path, not a link between two GPUs.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results_table  # noqa: E402


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,"
                               "noheader"], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def median_seconds(function, steps: int, sync) -> float:
    for _ in range(3):
        sync(function())
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        sync(function())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def collectives(tf, kdist, sizes, steps):
    strategy = kdist.strategy("mirrored", devices=["/gpu:0", "/gpu:1"], all_reduce="nccl")
    rows = []
    for millions in sizes:
        elements = int(millions * 1e6)
        with strategy.scope():
            values = strategy.run(lambda: tf.random.normal([elements]))
        reduce = tf.function(lambda v: strategy.reduce("SUM", v, axis=None))
        with tf.device("/gpu:0"):
            source = tf.random.normal([elements])
        copy = tf.function(lambda t: tf.identity(t * 1.0))
        all_reduce_s = median_seconds(lambda: reduce(values), steps, lambda t: t.numpy())
        copy_s = median_seconds(lambda: copy(source), steps, lambda t: t.numpy())
        nbytes = 4 * elements
        rows.append({"elements_millions": millions, "bytes": nbytes,
                     "all_reduce_ms": all_reduce_s * 1e3, "copy_ms": copy_s * 1e3,
                     "all_reduce_gb_s": nbytes / all_reduce_s / 1e9,
                     "copy_gb_s": 2 * nbytes / copy_s / 1e9,
                     "ratio_to_copy": all_reduce_s / copy_s})
    return rows


def training_steps(tf, keras, kdist, steps):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 784)).astype("float32")
    y = rng.integers(0, 10, size=(4096,))
    rows = []
    for jit in (False, True):
        for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
            for compression in (None, "fp16", "powersgd:4"):
                if jit and compression is not None:
                    continue  # XLA's all-reduce path: uncompressed only
                keras.mixed_precision.set_global_policy(policy)
                try:
                    with kdist.scope(strategy="mirrored", devices=["/gpu:0", "/gpu:1"],
                                     compression=compression):
                        model = keras.Sequential([keras.Input((784,)),
                                                  keras.layers.Dense(1024, activation="relu"),
                                                  keras.layers.Dense(1024, activation="relu"),
                                                  keras.layers.Dense(10)])
                        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(
                            from_logits=True), jit_compile=jit)
                    step = median_seconds(lambda: model.train_on_batch(x[:1024], y[:1024]),
                                          steps, lambda _: None)
                finally:
                    keras.mixed_precision.set_global_policy("float32")
                rows.append({"jit_compile": jit, "policy": policy,
                             "compression": compression or "none", "step_ms": step * 1e3})
    base = next(r["step_ms"] for r in rows if r["policy"] == "float32"
                and r["compression"] == "none" and not r["jit_compile"])
    for row in rows:
        row["ratio_to_float32"] = row["step_ms"] / base
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,4,16,64")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        sys.exit("benchmarks/gpu/suite.py: no GPU visible to TensorFlow (run `kdist doctor`)")
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=16384)] * 2)
    import keras

    import kdist

    sizes = [float(s) for s in args.sizes.split(",")]
    data = {"gpu": gpu_name(), "collectives": collectives(tf, kdist, sizes, args.steps),
            "training": training_steps(tf, keras, kdist, args.steps)}
    table = [f"GPU: {data['gpu']} (2 logical GPUs)", "",
             "| float32 elements | NCCL all-reduce | copy | all-reduce GB/s | copy GB/s | "
             "all-reduce / copy |", "|---|---|---|---|---|---|"]
    table += [f"| {r['elements_millions']:g}M | {r['all_reduce_ms']:.3f} ms | {r['copy_ms']:.3f} ms"
              f" | {r['all_reduce_gb_s']:.1f} | {r['copy_gb_s']:.1f} | {r['ratio_to_copy']:.2f} |"
              for r in data["collectives"]]
    table += ["", "| jit_compile | policy | compression | step | / float32 step |",
              "|---|---|---|---|---|"]
    table += [f"| {r['jit_compile']} | {r['policy']} | {r['compression']} | {r['step_ms']:.2f} ms |"
              f" {r['ratio_to_float32']:.2f} |" for r in data["training"]]
    results_table.save("gpu", "\n".join(table), data)


if __name__ == "__main__":
    main()
