"""A user's program for tests/test_verify.py: an Embedding model (sparse gradients, repeated ids)
beside a variable without a gradient, on ROWS rows (default 69) that leave a short last batch,
in batches of 16. INPUT picks how they come: NumPy arrays shuffled by fit (the default),
"tfdata" (a tf.data dataset of dict features with sample weights, shuffled without a seed),
"generator" (a Python generator looping over seeded reshuffles, with steps_per_epoch),
"pydataset1" and "pydataset2" (a keras.utils.PyDataset with 1 and 2 loader threads, shuffled by
fit) or "tfrecord" (one TFRecord file in RECORDS that the chief writes, read by every worker).
EXCHANGE picks the exchange path: the default (kdist's TCP ring), "collectives" (TensorFlow's),
"buckets" (bucket_bytes), "aggregate" (aggregate_every=2) or "fp16" (a lossy compressor). POLICY
sets Keras's global dtype policy (mixed_bfloat16: computed in bfloat16). OWN_LOSS=1 trains with a
train_step of its own whose loss is a mean over the replica's batch (SGD); BATCHNORM=1 adds a
BatchNormalization layer (per-replica statistics). With
PLANT=1 the first half of the Embedding's summed gradient slices is counted twice on every worker:
wrong, yet every worker agrees (the replica check cannot see it; kdist verify must). Not the whole
sum twice: Adam divides a gradient by its own scale, so that would train almost as one device.
With STALL_ALONE=1 the one-device run (KDIST_STRATEGY=default) waits forever before its fit.

    kdist verify --workers 2 -- python verify_job.py
"""

import os
import threading

import kdist
import keras
import numpy as np
import tensorflow as tf

ROWS = int(os.environ.get("ROWS", "69"))
if os.environ.get("POLICY"):
    keras.mixed_precision.set_global_policy(os.environ["POLICY"])
OPTIONS = {"": {}, "collectives": {"all_reduce": "ring"}, "buckets": {"bucket_bytes": 64},
           "aggregate": {"aggregate_every": 2},
           "fp16": {"compression": "fp16"}}[os.environ.get("EXCHANGE", "")]
rng = np.random.default_rng(0)
x = rng.integers(0, 40, (ROWS, 6)).astype("int32")
y = rng.normal(size=(ROWS, 1)).astype("float32")
if os.environ.get("PLANT"):
    from kdist.exchange import comm

    summed = comm.Comm.all_reduce_sum

    def half_twice(slices):
        rows = tf.shape(slices.values)[0]
        twice = tf.concat([tf.fill([rows // 2], 2.0), tf.ones([rows - rows // 2])], 0)
        return tf.IndexedSlices(slices.values * twice[:, None], slices.indices,
                                slices.dense_shape)

    def counted_twice(self, tensors):
        return [half_twice(t) if isinstance(t, tf.IndexedSlices) else t
                for t in summed(self, tensors)]

    comm.Comm.all_reduce_sum = counted_twice


class Unused(keras.layers.Layer):
    """Holds a variable the loss does not depend on (its gradient is None)."""

    def build(self, shape):
        self.unused = self.add_weight(shape=(2,), initializer="ones")

    def call(self, x):
        return x


class OwnLoss(keras.Model):
    """keras.io's VAE's way: a train_step that reduces its own loss with a mean, not divided by
    the replicas."""

    def train_step(self, data):
        features, target = data[:2]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(features, training=True) - target))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply([tf.zeros_like(v) if g is None else g for g, v in
                              zip(gradients, self.trainable_variables)], self.trainable_variables)
        return {"loss": loss}


with kdist.scope(**OPTIONS):
    ids = keras.Input((6,), dtype="int32", name="ids")
    pooled = keras.layers.GlobalAveragePooling1D()(Unused()(keras.layers.Embedding(40, 4)(ids)))
    if os.environ.get("BATCHNORM"):
        pooled = keras.layers.BatchNormalization(name="per_replica_norm")(pooled)
    if os.environ.get("DROPOUT"):  # each replica draws its rows of one device's masks
        pooled = keras.layers.Dropout(0.4, seed=3)(pooled)
    if os.environ.get("OWN_LOSS"):
        model = OwnLoss({"ids": ids}, keras.layers.Dense(1)(pooled))
        model.compile(keras.optimizers.SGD(0.1))
    else:
        model = keras.Model({"ids": ids}, keras.layers.Dense(1)(pooled))
        model.compile(keras.optimizers.Adam(0.01), "mse")
BATCHES = -(-ROWS // 16)


def batch(rows):
    return {"ids": x[rows]}, y[rows]


def generator():
    order = np.random.default_rng(1)
    while True:  # a fresh order each pass, the same on every worker
        shuffled = order.permutation(ROWS)
        for start in range(0, ROWS, 16):
            yield batch(shuffled[start:start + 16])


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return BATCHES

    def __getitem__(self, index):
        return batch(np.arange(index * 16, min(ROWS, (index + 1) * 16)))


def records(path):
    if kdist.cluster().is_chief:
        with tf.io.TFRecordWriter(path) as writer:
            for ids, target in zip(x, y):
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                    "y": tf.train.Feature(float_list=tf.train.FloatList(value=target))}))
                    .SerializeToString())
    kdist.barrier()
    features = {"ids": tf.io.FixedLenFeature([6], tf.int64),
                "y": tf.io.FixedLenFeature([1], tf.float32)}

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        return {"ids": tf.cast(example["ids"], tf.int32)}, example["y"]

    return tf.data.TFRecordDataset(path).map(parse).batch(16)


def stalled_alone():
    threading.Event().wait()


if os.environ.get("STALL_ALONE") and os.environ.get("KDIST_STRATEGY") == "default":
    stalled_alone()
source = os.environ.get("INPUT", "numpy")
if source == "tfdata":
    weights = rng.uniform(0.5, 2.0, ROWS).astype("float32")
    data = tf.data.Dataset.from_tensor_slices(({"ids": x}, y, weights))
    data = data.shuffle(ROWS).batch(16)  # unseeded, as the tutorials write it
    model.fit(data, epochs=3, verbose=0)
elif source == "generator":
    model.fit(generator(), steps_per_epoch=BATCHES, epochs=3, verbose=0)
elif source.startswith("pydataset"):
    model.fit(Batches(workers=int(source[-1])), shuffle=True, epochs=3, verbose=0)
elif source == "tfrecord":
    model.fit(records(os.path.join(os.environ["RECORDS"], "rows.tfrecord")), epochs=3, verbose=0)
else:
    model.fit({"ids": x}, y, batch_size=16, epochs=3, verbose=0)
print("the program went on after fit")
