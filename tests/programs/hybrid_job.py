"""Data parallel across 2 MultiWorkerMirrored workers x model parallel over each worker's 2 logical
CPUs; run by tests/test_model_parallel.py under `kdist launch --workers 2`. Each worker writes
OUT/<task>.json with its final weights and where its kernel shards live."""

import json
import os
import sys

import kdist

devices = kdist.split_cpu(2)
strategy = kdist.strategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 12)).astype("float32")
y = (x[:, :6].sum(1) > 0).astype("int32")
with kdist.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((12,)),
        kdist.layers.ModelParallelDense(32, devices=devices, gather_output=False, activation="relu"),
        kdist.layers.ModelParallelDense(2, devices=devices, partition="row", input_is_split=True)])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(x, y, batch_size=kdist.global_batch_size(16), epochs=4, verbose=0)
spec = kdist.cluster()
with open(os.path.join(sys.argv[1], f"{spec.task}.json"), "w") as f:
    json.dump({"replicas": strategy.num_replicas_in_sync, "loss": history.history["loss"],
               "weights": [w.tolist() for w in model.get_weights()],
               "variable_types": sorted({type(w.value).__name__ for w in model.weights}),
               "shard_devices": [w.value.device for w in model.layers[0].kernel_shards]}, f)
