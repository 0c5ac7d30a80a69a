"""A user's program for tests/test_verify.py: an Embedding model (sparse gradients, repeated ids)
beside a variable without a gradient, on ROWS rows (default 69) that leave a short last batch,
shuffled, unseeded: NumPy arrays, or with INPUT=tfdata a tf.data dataset of dict features with
sample weights. EXCHANGE picks the exchange path: the default (kdist's TCP ring), "collectives"
(TensorFlow's), "buckets" (bucket_bytes) or "aggregate" (aggregate_every=2). With PLANT=1 the sum of the Embedding's
gradients is counted twice on every worker: wrong, yet every worker agrees (the replica check
cannot see it; kdist verify must).

    kdist verify --workers 2 -- python verify_job.py
"""

import os

import kdist
import keras
import numpy as np
import tensorflow as tf

ROWS = int(os.environ.get("ROWS", "69"))
OPTIONS = {"": {}, "collectives": {"all_reduce": "ring"}, "buckets": {"bucket_bytes": 64},
           "aggregate": {"aggregate_every": 2}}[os.environ.get("EXCHANGE", "")]
rng = np.random.default_rng(0)
x = rng.integers(0, 40, (ROWS, 6)).astype("int32")
y = rng.normal(size=(ROWS, 1)).astype("float32")
if os.environ.get("PLANT"):
    from kdist.exchange import comm

    summed = comm.Comm.all_reduce_sum

    def counted_twice(self, tensors):
        return [tf.IndexedSlices(t.values * 2, t.indices, t.dense_shape)
                if isinstance(t, tf.IndexedSlices) else t for t in summed(self, tensors)]

    comm.Comm.all_reduce_sum = counted_twice


class Unused(keras.layers.Layer):
    """Holds a variable the loss does not depend on (its gradient is None)."""

    def build(self, shape):
        self.unused = self.add_weight(shape=(2,), initializer="ones")

    def call(self, x):
        return x


with kdist.scope(**OPTIONS):
    ids = keras.Input((6,), dtype="int32", name="ids")
    pooled = keras.layers.GlobalAveragePooling1D()(Unused()(keras.layers.Embedding(40, 4)(ids)))
    model = keras.Model({"ids": ids}, keras.layers.Dense(1)(pooled))
    model.compile(keras.optimizers.Adam(0.01), "mse")
if os.environ.get("INPUT") == "tfdata":
    weights = rng.uniform(0.5, 2.0, ROWS).astype("float32")
    data = tf.data.Dataset.from_tensor_slices(({"ids": x}, y, weights))
    data = data.shuffle(ROWS).batch(16)  # unseeded, as the tutorials write it
    model.fit(data, epochs=3, verbose=0)
else:
    model.fit({"ids": x}, y, batch_size=16, epochs=3, verbose=0)
print("the program went on after fit")
