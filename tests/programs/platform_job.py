"""One task of a 2-task MWMS job whose TF_CONFIG a platform wrote: the two kdist lines, plain Keras.

Usage: TF_CONFIG=... python platform_job.py OUT_DIR   (writes OUT_DIR/<task>.json)
"""

import json
import os
import sys

import kdist

with kdist.scope() as strategy:
    import keras
    import numpy as np

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
x = np.random.RandomState(0).rand(64, 4).astype("float32")
y = x.sum(axis=1, keepdims=True)
history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False)
spec = kdist.cluster()
with open(os.path.join(sys.argv[1], f"{spec.task}.json"), "w") as f:
    json.dump({"task": spec.task, "strategy": type(strategy).__name__,
               "replicas": strategy.num_replicas_in_sync, "loss": history.history["loss"],
               "weights": [w.tolist() for w in model.get_weights()]}, f)
