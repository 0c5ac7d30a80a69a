"""How a strategy of several replicas reads fit's input, and what deleting its reader costs.

Run by tests/test_mirrored.py as `python distributed_reads.py` (2 logical CPU devices, one
process). Prints one JSON line:
- `autotuned`: for each kind of input, whether the dataset the strategy reads keeps tf.data's
  autotuning model (fix distributed_reads_end_at_once: not for what Keras or kdist builds; a
  user's own tf.data pipeline as its author set it);
- `distributions`: how many datasets making fit's epoch iterator distributed, for each kind of
  input (kdist's fixes replace Keras's dataset: Keras's own is no longer distributed first);
- `per_device_autotuned`: whether the dataset of each device's iterator (TensorFlow's, over the
  MultiDeviceIterator) keeps the autotuning model: with the fix, and upstream (the fix removed);
- `iterators`: how many distributed iterators a 3-epoch fit makes, for each kind of input (fix
  one_iterator_per_epoch: one per epoch; `iterators_upstream`, the fix removed: Keras >= 3.7 makes
  two per epoch where it knows the epoch's size); `makes_two` whether the fix applies here;
- `seeded`: the rows each step trains (`batches`), under kdist.scope(), in a 2-epoch then a
  1-epoch fit of one dataset shuffled with a seed, and how many elements were read from its
  source (`reads`); `seeded_steps_per_epoch` with `steps_per_epoch`; `seeded_one_device` and
  `seeded_steps_per_epoch_one_device` the same on one device, Keras as shipped;
- `sparse_update`: an Embedding's 2-epoch fit with repeated ids: the replicas' largest
  difference and whether the step merges the rows of repeated indices before scattering (fix
  sparse_updates_merged_under_replicas; `sparse_update_upstream` the fix removed);
- `upstream`: how many MultiDeviceIterators over an autotuned dataset were read and deleted
  until a deletion waited (and how long it waited); `upstream_per_device`: the same over a
  dataset without autotuning, the per-device datasets as TensorFlow makes them.
"""

import contextlib
import json
import time

import kdist

devices = kdist.split_cpu(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.data.ops import multi_device_iterator_ops  # noqa: E402

from kdist.keras_seam import classes, inputs, patches  # noqa: E402

x = np.random.default_rng(0).normal(size=(64, 5)).astype("float32")
y = np.zeros((64, 1), "float32")


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return x[index * 16:(index + 1) * 16], y[index * 16:(index + 1) * 16]


def generator():
    while True:
        yield x[:16], y[:16]


def read_options(distributed):
    """The options of the dataset(s) `distributed` reads (kdist's Continuing unwrapped)."""
    distributed = getattr(distributed, "dataset", distributed)
    if hasattr(distributed, "_original_dataset"):  # experimental_distribute_dataset
        return [distributed._original_dataset.options()]
    return [dataset.options() for dataset in distributed._datasets]  # ...from_function


def autotuned(strategy, **inputs_of_fit) -> list:
    iterator = classes.resolve("TFEpochIterator")(distribute_strategy=strategy, **inputs_of_fit)
    list(zip(range(1), iterator.enumerate_epoch()))  # from_function datasets are made lazily
    return [options.autotune.enabled is not False for options in
            read_options(iterator._distributed_dataset)]


def distributions(strategy, **inputs_of_fit) -> int:
    """How many datasets are distributed to make fit's epoch iterator (each is a build)."""
    made = []
    names = ("experimental_distribute_dataset", "distribute_datasets_from_function")
    for name in names:
        method = getattr(strategy, name)
        setattr(strategy, name, lambda *a, _method=method, **k: made.append(1) or _method(*a, **k))
    try:
        classes.resolve("TFEpochIterator")(distribute_strategy=strategy, **inputs_of_fit)
    finally:
        for name in names:
            delattr(strategy, name)
    return len(made)


def iterators(strategy, **inputs_of_fit) -> int:
    """How many distributed iterators `fit(..., epochs=3)` makes (each a MultiDeviceIterator)."""
    from tensorflow.python.distribute import input_lib

    made = []
    kinds = (input_lib.DistributedDataset, input_lib.DistributedDatasetsFromFunction)
    originals = {kind: kind.__iter__ for kind in kinds}
    for kind in kinds:
        kind.__iter__ = lambda self, _iter=originals[kind]: made.append(1) or _iter(self)
    try:
        with kdist.scope():
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(**inputs_of_fit, epochs=3, verbose=0)
    finally:
        for kind, method in originals.items():
            kind.__iter__ = method
    return len(made)


def batches_trained(scoped: bool, steps_per_epoch=None) -> dict:
    """The rows (sorted ids) each step trains in a 2-epoch fit, then a 1-epoch fit of a new
    model, of one dataset shuffled with a seed (reshuffled each epoch, no repeat): under
    kdist.scope() (both replicas' shares together) or on one device (no strategy); and how many
    elements were read from the dataset's source in all."""
    reads = []

    def read(i):
        i = tf.py_function(lambda v: reads.append(1) or v, [i], tf.int64)
        return tf.fill([1], tf.cast(i, tf.float32))

    dataset = tf.data.Dataset.range(64).map(read)
    dataset = dataset.map(lambda v: (v, v)).shuffle(64, seed=7).batch(16)
    seen, steps = [], []

    class Seen(keras.layers.Layer):
        def call(self, rows, training=None):
            if training:
                tf.py_function(lambda v: seen.extend(v.numpy().ravel().astype(int).tolist())
                               or 0.0, [rows], tf.float32)
            return rows

    def on_batch_end(*_, **__):
        steps.append(sorted(seen))
        seen.clear()

    for epochs in (2, 1):
        with kdist.scope() if scoped else contextlib.nullcontext():
            model = keras.Sequential([keras.Input((1,)), Seen(), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(dataset, epochs=epochs, verbose=0, steps_per_epoch=steps_per_epoch,
                  callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=on_batch_end)])
    return {"batches": steps, "reads": len(reads)}


def sparse_update() -> dict:
    """A 2-epoch fit of an Embedding of 1,000 rows over 512 x 20 ids a batch (many repeated):
    the largest difference between the replicas' tables, and whether the traced step merges the
    sparse update's rows (fix sparse_updates_merged_under_replicas) before scattering them."""
    from kdist.keras_seam import fixes

    merges, merged_rows = [], fixes.merged_rows
    fixes.merged_rows = lambda value: merges.append(1) or merged_rows(value)  # counted as traced
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, (1024, 20)).astype("int32")
    target = rng.normal(size=(1024, 1)).astype("float32")
    with kdist.scope(check_replicas="warn") as scope:
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((20,), dtype="int32"),
                                  keras.layers.Embedding(1000, 16),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.5), "mse")
    try:
        model.fit(ids, target, batch_size=512, epochs=2, shuffle=False, verbose=0)
    finally:
        fixes.merged_rows = merged_rows
    first, second = (t.numpy() for t in
                     scope.experimental_local_results(model.layers[0].embeddings.value))
    return {"replica_difference": float(np.abs(first - second).max()),
            "merges_rows": bool(merges)}


def per_device_autotuned(strategy) -> list:
    """For each replica's iterator of a distributed user's dataset: does its dataset autotune?"""
    distributed = iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(16)))
    device_iterators = distributed._iterators[0]._iterator._device_iterators
    return [d._dataset.options().autotune.enabled is not False for d in device_iterators]


def deletions_until_a_wait(autotuned_source: bool, most: int = 60) -> dict:
    """Upstream: MultiDeviceIterators over one device, each read for 0.3-1.05 s (one shuffled
    batch gathered from 8,000 x 784 floats per 3 ms, as steps take), then deleted, until a
    deletion waits over 0.1 s (1 to 5 in 16 did here), at most `most`. The dataset they read
    autotunes if `autotuned_source` (else only the per-device datasets may)."""
    rows = np.zeros((8000, 784), "float32")
    for k in range(most):
        order = tf.data.Dataset.range(len(rows)).shuffle(len(rows), seed=k).batch(64)
        dataset = tf.data.Dataset.zip((order, tf.data.Dataset.from_tensors(rows).repeat()))
        dataset = dataset.map(lambda taken, every: tf.gather(every, taken)).repeat()
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
        iterator = multi_device_iterator_ops.OwnedMultiDeviceIterator(
            dataset if autotuned_source else inputs.without_autotune(dataset), ["/cpu:0"])
        started = time.perf_counter()
        while time.perf_counter() - started < 0.3 + 0.05 * (k % 16):
            next(iterator)
            time.sleep(0.003)
        started = time.perf_counter()
        del iterator
        if time.perf_counter() - started > 0.1:
            return {"deletions": k + 1, "wait_s": time.perf_counter() - started}
    return {"deletions": most, "wait_s": None}


with kdist.scope(devices=devices) as strategy:
    pass


def for_each_input(measure) -> dict:
    """`measure(strategy, **inputs of fit)` for each kind of input users bring."""
    return {
        "arrays, shuffled": measure(strategy, x=x, y=y, batch_size=16, shuffle=True),
        "arrays (evaluate)": measure(strategy, x=x, y=y, batch_size=16, shuffle=False),
        "generator": measure(strategy, x=generator(), steps_per_epoch=4),
        "PyDataset": measure(strategy, x=Batches()),
        "user's tf.data": measure(
            strategy, x=tf.data.Dataset.from_tensor_slices((x, y)).batch(16)),
    }


report = {
    "replicas": strategy.num_replicas_in_sync,
    "autotuned": for_each_input(autotuned),
    "distributions": for_each_input(distributions),
    "per_device_autotuned": per_device_autotuned(strategy),
    "iterators": for_each_input(iterators),
    "sparse_update": sparse_update(),
    "seeded": batches_trained(scoped=True),
    "seeded_steps_per_epoch": batches_trained(scoped=True, steps_per_epoch=4),
    "makes_two": patches.patch("one_iterator_per_epoch").active,
    "upstream": deletions_until_a_wait(autotuned_source=True),
}
patches.patch("one_iterator_per_epoch").uninstall()
report["iterators_upstream"] = for_each_input(iterators)
patches.patch("sparse_updates_merged_under_replicas").uninstall()
report["sparse_update_upstream"] = sparse_update()
report["seeded_one_device"] = batches_trained(scoped=False)  # as Keras does, no fix
report["seeded_steps_per_epoch_one_device"] = batches_trained(scoped=False, steps_per_epoch=4)
patches.patch("distributed_reads_end_at_once").uninstall()
report.update(per_device_autotuned_upstream=per_device_autotuned(strategy),
              upstream_per_device=deletions_until_a_wait(autotuned_source=False))
print(json.dumps(report))
