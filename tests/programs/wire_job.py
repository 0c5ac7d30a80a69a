"""Bytes on the wire and accuracy per compressor, 2 MultiWorkerMirrored workers on loopback.

Run by tests/test_compression_wire.py (and benchmarks/compression_wire.py) as
`kdist launch --workers 2 -- python tests/programs/wire_job.py OUT [STEPS] [EPOCHS]`. Worker 0
writes OUT/wire.json: loopback bytes per training step of the 784-1024-1024-10 MLP (read from
/proc/net/dev, which counts every packet between the two local workers once), and test accuracy
on the UCI digits after the same epochs, per compressor.
"""

import json
import os
import sys
import time

import kdist

strategy = kdist.strategy()
out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 16

import keras  # noqa: E402
import numpy as np  # noqa: E402

from kdist import compression  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import mnist_data  # noqa: E402

WARMUP_STEPS = 23  # TopK's accuracy run: one epoch at 6.25% first (DGC's sparsity warm-up)
COMPRESSORS = {  # name -> factory(warm-up steps)
    "none": lambda warmup: None,
    "fp16": lambda warmup: compression.from_name("fp16"),
    "powersgd_r4": lambda warmup: compression.from_name("powersgd:4"),
    "topk_1pct": lambda warmup: compression.from_name(
        "topk:0.01", momentum=MOMENTUM, warmup=(0.0625,) if warmup else (), warmup_steps=warmup,
        values="float16")}
MOMENTUM = 0.9  # SGD momentum; TopK applies it itself (momentum correction), SGD then has none
GLOBAL_BATCH = kdist.global_batch_size(32)


def loopback_bytes() -> int:
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[0])  # received bytes
    raise RuntimeError("no loopback interface in /proc/net/dev")


def mlp(inputs, compressor, seed=0):
    keras.utils.set_random_seed(seed)
    momentum = 0.0 if getattr(compressor, "momentum", 0.0) else MOMENTUM
    with kdist.scope(compression=compressor):
        model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(0.05, momentum=momentum),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


rng = np.random.default_rng(0)
wire_x = rng.random((GLOBAL_BATCH * (steps + 3), 784), dtype=np.float32)
wire_y = rng.integers(0, 10, len(wire_x)).astype("int32")
digits = mnist_data.load("digits")
results = {}
for name, make in COMPRESSORS.items():
    model = mlp(784, make(0))  # bytes: the compressed phase only
    warm = GLOBAL_BATCH * 3  # traces the train function; not measured
    model.fit(wire_x[:warm], wire_y[:warm], batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
              shuffle=False)
    before, started = loopback_bytes(), time.perf_counter()
    model.fit(wire_x[warm:], wire_y[warm:], batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
              shuffle=False)
    seconds, sent = time.perf_counter() - started, loopback_bytes() - before
    trained = mlp(64, make(WARMUP_STEPS))
    trained.fit(digits.x_train.reshape(-1, 64), digits.y_train, batch_size=GLOBAL_BATCH,
                epochs=epochs, verbose=0, shuffle=False)  # reproducible across launches
    accuracy = trained.evaluate(digits.x_test.reshape(-1, 64), digits.y_test, verbose=0)[1]
    results[name] = {"bytes_per_step": sent / steps, "seconds_per_step": seconds / steps,
                     "nominal_ratio": compression.stats(model)["comm_ratio"],
                     "digits_accuracy": accuracy}
    print(name, results[name], flush=True)

parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
if kdist.cluster().is_chief:
    with open(os.path.join(out_dir, "wire.json"), "w") as f:
        json.dump({"parameters": parameters, "workers": 2, "steps": steps, "epochs": epochs,
                   "ring_lower_bound_bytes": 2 * 2 * (2 - 1) / 2 * 4 * parameters,
                   "results": results}, f, indent=2)
