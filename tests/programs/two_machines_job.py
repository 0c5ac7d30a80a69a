"""A user's training script, run by tests/test_launcher.py on two emulated machines
(`kdist launch --spec two-machines.json` on each) and once without TF_CONFIG (one device, the
global batch). Writes OUT_DIR/<task>.npz (the weights) and OUT_DIR/<task>.json (the losses).

    python tests/programs/two_machines_job.py OUT_DIR
"""

import json
import os
import sys

import kdist
import keras
import numpy as np

out_dir = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")

keras.utils.set_random_seed(1)
with kdist.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)

name = kdist.cluster().task or "one-device"
np.savez(os.path.join(out_dir, f"{name.replace(':', '-')}.npz"), *model.get_weights())
with open(os.path.join(out_dir, f"{name.replace(':', '-')}.json"), "w") as f:
    json.dump({"loss": history.history["loss"], "task": name,
               "replicas": kdist.strategy().num_replicas_in_sync}, f)
print(f"{name}: loss {history.history['loss'][0]:.4f} -> {history.history['loss'][-1]:.4f}")
