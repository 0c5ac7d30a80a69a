"""A ReLU network trained at a learning rate high enough to be chaotic, for tests/test_verify.py:
two runs that part by a rounding error at one step part by far more some steps on (kdist verify
replaying the 64 steps of its 2 epochs from the first step's start only, on 2 workers: 0.0518
apart, 5000 times float32's tolerance). The distributed run is exact at every step, so
`kdist verify` must pass it.

    kdist verify --workers 2 --steps 64 -- python chaotic_job.py
"""

import os

import kdist
import keras
import numpy as np

mnist = np.load(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "data",
                             "mnist_offline.npz"))
x = (mnist["x_train"][:2048] / 255).astype("float32").reshape(-1, 784)
y = mnist["y_train"][:2048].astype("int64")
with kdist.scope():
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(1.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=kdist.global_batch_size(32), epochs=2, verbose=0)
