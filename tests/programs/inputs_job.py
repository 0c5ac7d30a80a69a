"""fit's inputs under MultiWorkerMirrored (kdist/keras_seam/inputs.py), for tests/test_inputs.py:
which examples each worker trains on in each epoch, for a shuffled PyDataset (1 and 2 loader
threads), a dataset read from one TFRecord file, a tf.data dataset shuffled without a seed
(64 and 69 rows) and one shuffled with a seed, in fit (and in one device's fit) and in a custom
loop; first with kdist's input fixes, then without them (the upstream behaviour).

    kdist launch --workers 2 -- python inputs_job.py OUT     writes OUT/<task>.json
"""

import contextlib
import json
import os
import sys

import kdist
import keras
import numpy as np
import tensorflow as tf
from kdist.keras_seam import patches

out = sys.argv[1]
spec = kdist.cluster()
FIXES = ("consistent_pydataset_order", "tf_data_under_multi_worker")
kdist.strategy()  # installs kdist's fixes
seen: list = []


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        rows = np.arange(index * 16, (index + 1) * 16, dtype="float32").reshape(16, 1)
        return rows, rows


class Seen(keras.layers.Layer):
    """Records the example ids this worker trains on."""

    def call(self, x, training=None):
        if training:
            tf.py_function(lambda v: seen.extend(v.numpy().ravel().astype(int).tolist()) or 0.0,
                           [x], tf.float32)
        return x


def trained(data, epochs=2, one_device=False, **fit_args):
    """The example ids this worker trained on, per epoch, or the error fit raised; with
    `one_device`, those one device trains on (no strategy)."""
    with contextlib.nullcontext() if one_device else kdist.scope():
        model = keras.Sequential([keras.Input((1,)), Seen(), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    per_epoch = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda *_: seen.clear(), on_epoch_end=lambda *_: per_epoch.append(seen[:]))
    try:
        model.fit(data, epochs=epochs, verbose=0, callbacks=[record], **fit_args)
    except Exception as error:  # the outcome under test
        return f"{type(error).__name__}: {error}"[:600]
    return per_epoch


def records(path):
    if spec.is_chief:
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(64):
                feature = tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)]))
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature={"x": feature})).SerializeToString())
    kdist.barrier()

    def parse(record):
        x = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]
        return x, x

    return tf.data.TFRecordDataset(path).map(parse).batch(16)


def shuffled(rows=64):
    """The tutorials' pipeline: examples shuffled without a seed, in batches of 16."""
    examples = tf.data.Dataset.range(rows).map(lambda i: tf.fill([1], tf.cast(i, tf.float32)))
    return examples.map(lambda x: (x, x)).shuffle(rows).batch(16)


def seeded(rows=64, reads=None):
    """keras.io's pipeline: examples shuffled with a seed (reshuffled each epoch), no repeat;
    each element read from its source appended to `reads`."""
    examples = tf.data.Dataset.range(rows)
    if reads is not None:
        examples = examples.map(
            lambda i: tf.py_function(lambda v: reads.append(1) or v, [i], tf.int64))
    examples = examples.map(lambda i: tf.fill([1], tf.cast(i, tf.float32)))
    return examples.map(lambda x: (x, x)).shuffle(rows, seed=7).batch(16)


def two_fits(one_device=False):
    """A 2-epoch fit, then a 1-epoch fit of a new model on the same dataset object; and how many
    elements this process read from the dataset's source."""
    reads = []
    data = seeded(reads=reads)
    first = trained(data, epochs=2, one_device=one_device)
    second = trained(data, epochs=1, one_device=one_device)
    return (first + second if isinstance(first, list) and isinstance(second, list) else
            [first, second]), len(reads)


def own_loop(one_device=False):
    """Each epoch's example ids a custom training loop reads (TensorFlow's tutorial: a new
    iterator of the distributed dataset per epoch), this worker's share of each batch."""
    data = seeded()
    if one_device:
        return [[int(v) for batch in data for v in batch[0].numpy().ravel()] for _ in range(3)]
    strategy = kdist.strategy()
    distributed = strategy.experimental_distribute_dataset(data)
    return [[int(v) for batch in distributed
             for part in strategy.experimental_local_results(batch[0])
             for v in part.numpy().ravel()] for _ in range(3)]


def file_policy(dataset):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    return dataset.with_options(options)


def save():
    with open(os.path.join(out, f"{spec.task_type}{spec.task_index}.json"), "w") as f:
        json.dump(report, f)


report: dict = {}
report["pydataset_1"] = trained(Batches(workers=1), shuffle=True)
report["pydataset_2"] = trained(Batches(workers=2), shuffle=True)
report["tfrecord"] = trained(records(os.path.join(out, "one.tfrecord")))
report["tfdata_shuffled"] = trained(shuffled())
report["tfdata_shuffled_short"] = trained(shuffled(69))  # 5 batches, the last of 5 rows
report["tfdata_seeded"], report["tfdata_seeded_reads"] = two_fits()
report["own_loop_seeded"] = own_loop()
report["tfrecord_file_policy"] = trained(file_policy(records(os.path.join(out, "file.tfrecord"))))
# Upstream (kdist's fixes removed), last: a failed first batch leaves the workers' collectives out
# of step, so nothing collective follows it.
for name in FIXES:
    patches.patch(name).uninstall()
report["upstream_pydataset_2"] = trained(Batches(workers=2), shuffle=True)
tf.random.set_seed(None)  # no global seed: each process draws its own shuffle seeds
report["upstream_tfdata_shuffled"] = trained(shuffled())
# One device, as a program without kdist runs it: no global seed, Keras's own epoch iterators.
patches.patch("one_iterator_per_epoch").uninstall()
report["tfdata_seeded_one_device"], report["tfdata_seeded_one_device_reads"] = \
    two_fits(one_device=True)
report["own_loop_seeded_one_device"] = own_loop(one_device=True)
save()
report["upstream_tfrecord"] = trained(records(os.path.join(out, "upstream.tfrecord")), epochs=1)
save()
os._exit(0)  # TensorFlow's runtime may still wait on the aborted collective
