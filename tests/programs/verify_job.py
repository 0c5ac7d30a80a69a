"""A user's program for tests/test_verify.py: an Embedding model (sparse gradients) on 69 rows
that leave a short last batch, shuffled, unseeded: NumPy arrays, or with INPUT=tfdata a tf.data
dataset of dict features with sample weights. With PLANT=1 the sum of the Embedding's
gradients is counted twice on every worker: wrong, yet every worker agrees (the replica check
cannot see it; kdist verify must).

    kdist verify --workers 2 -- python verify_job.py
"""

import os

import kdist
import keras
import numpy as np

rng = np.random.default_rng(0)
x = rng.integers(0, 40, (69, 6)).astype("int32")
y = rng.normal(size=(69, 1)).astype("float32")
if os.environ.get("PLANT"):
    import tensorflow as tf
    from kdist.exchange import comm

    summed = comm.Comm.all_reduce_sum

    def counted_twice(self, tensors):
        return [tf.IndexedSlices(t.values * 2, t.indices, t.dense_shape)
                if isinstance(t, tf.IndexedSlices) else t for t in summed(self, tensors)]

    comm.Comm.all_reduce_sum = counted_twice

with kdist.scope():
    ids = keras.Input((6,), dtype="int32", name="ids")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(40, 4)(ids))
    model = keras.Model({"ids": ids}, keras.layers.Dense(1)(pooled))
    model.compile(keras.optimizers.Adam(0.01), "mse")
if os.environ.get("INPUT") == "tfdata":
    import tensorflow as tf

    weights = rng.uniform(0.5, 2.0, 69).astype("float32")
    data = tf.data.Dataset.from_tensor_slices(({"ids": x}, y, weights))
    data = data.shuffle(69).batch(16)  # unseeded, as the tutorials write it
    model.fit(data, epochs=3, verbose=0)
else:
    model.fit({"ids": x}, y, batch_size=16, epochs=3, verbose=0)
print("the program went on after fit")
