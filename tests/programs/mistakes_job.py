"""A user's own mistakes on 2 workers, for tests/test_agreement.py.

    kdist launch --workers 2 -- python mistakes_job.py MODE

MODE: ``outside`` (the model built and compiled before kdist.scope()), ``compiled_inside`` (built
before it, compiled inside), ``batch_size`` and
``width`` (worker 1 reads a different batch size, or builds its model lazily with a different
layer width), ``same`` (no mistake: trains).
"""

import sys

import kdist
import keras
import numpy as np

mode = sys.argv[1]
spec = kdist.cluster()
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = x.sum(1, keepdims=True)
other = spec.task_index == 1


def model(width=8):
    return keras.Sequential([keras.layers.Dense(width), keras.layers.Dense(1)])


if mode == "outside":
    net = model()
    net.compile("sgd", "mse")
    with kdist.scope():
        pass
elif mode == "compiled_inside":
    net = model()
    with kdist.scope():
        net.compile("sgd", "mse")
else:
    with kdist.scope():
        net = model(16 if mode == "width" and other else 8)  # built by the first batch
        net.compile("sgd", "mse")
net.fit(x, y, batch_size=32 if mode == "batch_size" and other else 16, epochs=1, verbose=0)
print(f"trained on {spec.task}")
