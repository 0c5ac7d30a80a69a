"""fit's input under several replicas: every worker sees the same global batches, in the same
order, each taking its replicas' shares, as one device takes the whole batch.

Keras hands a tf.data dataset of global batches to `experimental_distribute_dataset`, which
shards it across the workers by DATA (each worker computes every batch and keeps its share) or
by FILE, and makes two new iterators per epoch. These inputs go wrong there:

1. **In-memory arrays** (`fit(x=np_array, shuffle=True)`): Keras <= 3.15's ArrayDataAdapter
   permutes the indices with an unseeded `tf.random.shuffle` in every process, so each worker
   takes its slice of a *different* permutation: some examples train twice per epoch, others
   never (Keras 3.16 shuffles with a stateless seed per epoch, the same on every worker). And
   each epoch's iterator copies the arrays into the dataset's graph: seconds per epoch boundary
   for 25 MB of arrays. Where every worker's program set the same TensorFlow seed, kdist reads
   one device's order from Keras's own pipeline over the row indices (`keras_order`: seeded,
   one device draws the same permutation every epoch); else it shuffles with one seed shared
   by every worker (`shared_seed`), a new permutation each epoch. Each worker gathers only its
   replicas' rows (`array_shares`), from one iterator that continues across epochs
   (`Continuing`).
2. **`keras.utils.PyDataset`** with `shuffle=True` (fit's default): each worker shuffles the batch
   order with Python's unseeded `random`, so again the workers' shares of a step come from
   different batches (64 of 128 examples trained twice, measured). And under Mirrored too, on a
   loaded machine, an epoch trained on other batches than one device's (the iterator Keras makes
   at an epoch's end shares the loader with the next one's). kdist loads the batches in one
   order on every worker, with the dataset's own `workers` threads, in order, each iterator its
   own loader (`pydataset_shares`), under every strategy of several replicas. The order is one
   device's (`PYDATASET_ORDERS`): from Keras 3.16 a `random.Random` of the epoch's index, the
   same on every worker; for Keras 3.6-3.15 one `random.shuffle` of Python's `random` per epoch,
   in one process and wherever every worker's `random` held the same state at the fit's start
   (compared with the fit's other facts: `kdist.wiring.agreement`); where they differ (a
   program that seeded nothing), and on Keras 3.5, a seed the workers share, said once
   where seeding the program would give one device's order.
3. **One file, more workers**: a dataset read from fewer files than workers fails at its first
   batch with TensorFlow's "Could not apply FILE based sharding" under the default AUTO policy.
   kdist shards it by DATA instead and says so in one line (`file_sharding`); an explicit FILE
   policy is refused with the fix. And a tf.data dataset of a known number of batches is
   iterated by one iterator across epochs (`continuing_epochs`): a new one per epoch costs up
   to a second under MultiWorkerMirrored (the sharding rewrite of its graph; 67 ms an epoch on
   2 workers here for a small pipeline). Not one that reshuffles each iteration: its epochs
   must draw the seeds one device's draw.
4. **An unseeded `tf.data` shuffle** (`dataset.shuffle(1000)`, the tutorials' idiom) draws its
   seed per process, so each worker takes its shares of a *different* order: examples train
   twice per epoch, others never. Where the program set no global seed, kdist sets TensorFlow's
   when it builds MultiWorkerMirrored (`seed_unseeded_shuffles`), so every
   worker's unseeded shuffles draw the same seeds, in the program's order, and still reshuffle
   each epoch.
5. **A Python generator** under several replicas of one process (Mirrored): the batches it yields
   reach TensorFlow without a copy (`from_generator`), and splitting a batch between the replicas
   lets the step write into the memory of the user's own arrays (a generator yielding
   `y[i:i + 64]` had `y` overwritten whenever `y` lay on 64 bytes, as NumPy places large arrays:
   Keras 3.15 + TensorFlow 2.21 and Keras 3.5 + TensorFlow 2.17, with MirroredStrategy alone;
   not reproduced on TensorFlow 2.22), so every later pass over them trained on wrong data.
   kdist hands TensorFlow a copy of each batch the generator yields (`copied_batches`).
   Under MultiWorkerMirrored each worker runs the generator and keeps its replicas' rows of every
   batch (`generator_shares`).
6. **Every step's agreement on the data's end.** Under MultiWorkerMirrored TensorFlow reads a
   dataset not known to be endless with partial-batch handling: every step all-reduces across
   workers how many replicas got a batch (about 2 ms of a 4.5 ms step on 2 workers here, a
   generator's fit). kdist's pipelines of a PyDataset's and a generator's batches (`batch_shares`)
   yield one share per replica for every global batch on every worker, an empty share included,
   so every worker runs out at the same step: they are read without the agreement
   (`tf_internals.ending_together`), but for executions of several steps, which would end
   halfway. In-memory arrays that fit shuffles and counted tf.data epochs are read endlessly
   (`Continuing`), which TensorFlow never asks.
"""

from __future__ import annotations

import json
import logging
import random
import zlib
from concurrent import futures

from kdist.keras_seam import versions

logger = logging.getLogger("kdist")

READERS = ("TFRecordDatasetV2", "TFRecordDatasetV1", "_TFRecordDataset", "TextLineDatasetV2",
           "TextLineDatasetV1", "_TextLineDataset", "FixedLengthRecordDatasetV2",
           "FixedLengthRecordDatasetV1", "_FixedLengthRecordDataset")


def shared_seed(spec) -> int:
    """One shuffle seed for every worker of the job (from the addresses of its cluster); for a
    strategy with no cluster (one process, a strategy kdist did not build), this process's own."""
    if spec is None:
        return random.SystemRandom().getrandbits(32)
    return zlib.crc32(json.dumps(spec.jobs, sort_keys=True).encode())


def seed_unseeded_shuffles() -> int | None:
    """Sets TensorFlow's global random seed unless the program set one; returns the seed set
    (None: the program's own stands). The seed is the one TensorFlow pairs with an op's own seed
    when no global seed is set, so that ops given a seed (`shuffle(n, seed=7)`) draw exactly
    what they draw in one process without kdist; any other global seed would change them."""
    import tensorflow as tf
    from tensorflow.python.framework import random_seed

    if tf.compat.v1.get_seed(None)[0] is not None:
        return None
    tf.random.set_seed(random_seed.DEFAULT_GRAPH_SEED)
    return random_seed.DEFAULT_GRAPH_SEED


def program_seed() -> int | None:
    """TensorFlow's global seed where the program set one; None where it is unset or
    `seed_unseeded_shuffles`'."""
    import tensorflow as tf
    from tensorflow.python.framework import random_seed

    seed = tf.compat.v1.get_seed(None)[0]
    return None if seed in (None, random_seed.DEFAULT_GRAPH_SEED) else int(seed)


# ------------------------------------------------------------------ a batch's shares
def share(batch, replica, replicas: int):
    """Replica `replica`'s rows of a global `batch` (a structure of tensors), split as
    tf.distribute splits a batch: the first rows % replicas shares one row longer; a share of a
    short last batch may be empty."""
    import tensorflow as tf

    rows = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
    replica = tf.cast(replica, tf.int64)
    size, longer = rows // replicas, rows % replicas
    start = replica * size + tf.minimum(replica, longer)
    stop = start + size + tf.cast(replica < longer, tf.int64)
    return tf.nest.map_structure(lambda t: t[start:stop], batch)


def pipeline_shares(batches, context, take):
    """This input pipeline's replicas' shares of each global batch of `batches`, one element per
    replica in turn: ``take(element, replica)`` takes one replica's share of an element."""
    import tensorflow as tf

    local = context.num_replicas_in_sync // context.num_input_pipelines
    first = context.input_pipeline_id * local
    plain = tf.autograph.experimental.do_not_convert  # no Python control flow to convert: its
    # conversion took 0.25 s of each fit's start (4 functions), for nothing
    if local == 1:
        return batches.map(plain(lambda *element: take(element, first)))
    return batches.flat_map(plain(lambda *element: tf.data.Dataset.range(first, first + local).map(
        plain(lambda replica: take(element, replica)))))


def without_autotune(dataset):
    """`dataset` without tf.data's autotuning model. A strategy of several replicas reads a
    dataset through a MultiDeviceIterator, and deleting one (at the end of every fit, evaluate and
    predict) waits until its autotuning thread next wakes up: up to its optimization period, which
    doubles as the iterator lives (1.1-1.4 s after a 3 s fit here, 5 s after 5 s). Its prefetch
    buffers still grow as they need (tf.data's own per-buffer tuning), and a parallel map set to
    AUTOTUNE runs on as many threads as the machine has cores."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


# ------------------------------------------------------------------ 1. in-memory arrays
def row_indices(adapter):
    """An ArrayDataAdapter like `adapter` over the row indices (0 .. rows - 1): its dataset
    yields the indices of each batch Keras would yield."""
    import numpy as np
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    return ArrayDataAdapter(np.arange(adapter._num_samples), batch_size=adapter._batch_size,
                            shuffle=adapter._shuffle)


def keras_order(indices_dataset):
    """The rows of an epoch in the order Keras draws them on one device, read once from Keras's
    own pipeline over the row indices (`row_indices`). Seeded, every epoch's fresh iterator
    draws this same order (Keras 3.5, 3.15 and 3.16, measured: `tf.random.shuffle` in a dataset
    map restarts with each iterator)."""
    import numpy as np

    return np.concatenate(list(indices_dataset.as_numpy_iterator()))


def array_shares(adapter, seed: int, context, order=None):
    """This pipeline's shares of every global batch of an ArrayDataAdapter's arrays, in `order`
    (the rows of one epoch, the same every epoch: `keras_order`) or shuffled with `seed` (a new
    permutation each epoch), repeated. Only the rows of its own shares are gathered; the arrays
    ride beside the indices (from_tensors), since an array captured by the map function is
    copied into the dataset's graph each time an iterator is made."""
    import keras
    import numpy as np
    import tensorflow as tf
    from keras.src.trainers.data_adapters import array_slicing

    inputs = keras.tree.lists_to_tuples(
        array_slicing.convert_to_sliceable(adapter._inputs, target_backend="tensorflow"))
    if not all(isinstance(t, np.ndarray) or (tf.is_tensor(t) and not isinstance(
            t, (tf.SparseTensor, tf.RaggedTensor))) for t in keras.tree.flatten(inputs)):
        raise ValueError("fit(shuffle=True) on in-memory sparse or ragged inputs under "
                         "MultiWorkerMirroredStrategy cannot be shuffled identically on every "
                         "worker; pass a tf.data.Dataset (shuffled with a fixed seed) or "
                         "shuffle=False")
    indices = tf.data.Dataset.range(adapter._num_samples)
    if order is not None:
        indices = tf.data.Dataset.from_tensor_slices(order).batch(adapter._batch_size)
    elif adapter._shuffle == "batch":
        indices = indices.batch(adapter._batch_size).shuffle(
            adapter.num_batches, seed=seed, reshuffle_each_iteration=True)
    else:
        indices = indices.shuffle(adapter._num_samples, seed=seed,
                                  reshuffle_each_iteration=True).batch(adapter._batch_size)
    batches = tf.data.Dataset.zip((indices, tf.data.Dataset.from_tensors(inputs).repeat()))

    def take(element, replica):
        rows, arrays = element
        rows = share(rows, replica, context.num_replicas_in_sync)
        return keras.tree.map_structure(lambda t: tf.gather(t, rows), arrays)

    return without_autotune(pipeline_shares(batches, context, take).repeat()
                            .prefetch(tf.data.AUTOTUNE))


class Continuing:
    """A distributed dataset whose every `iter()` continues one iterator, so that an epoch
    begins without a new one (Keras makes two new iterators per epoch, each tens of milliseconds
    under MultiWorkerMirrored). Its dataset repeats: each epoch takes
    the next `num_batches` batches, one permutation, as Keras counts them."""

    def __init__(self, dataset):
        self.dataset = dataset
        self._iterator = None

    def __iter__(self):
        if self._iterator is None:
            self._iterator = iter(self.dataset)
        return self._iterator

    def __getattr__(self, name):
        return getattr(self.dataset, name)


def continuing_epochs(dataset, steps_per_epoch):
    """`dataset` repeated, for one iterator across epochs (`Continuing`), where each epoch is
    known to be its `cardinality` batches (Keras counts them; no `steps_per_epoch`) and no op
    of it draws a new seed per iterator; None where an epoch ends only when the data does, or
    where the dataset reshuffles (`reshuffles_each_iteration`): one device's epoch e trains the
    shuffle's draw 2e - 1 (Keras makes two iterators per epoch), and a repeated dataset's next
    pass draws when the distributed iterator reads ahead, before the epoch's end (measured:
    epoch 2 trained draw 2), so those datasets get a new iterator per epoch. Not prefetched: a
    prefetching thread would draw a pass's seed at a moment that differs per worker."""
    if steps_per_epoch or int(dataset.cardinality()) < 0:  # INFINITE or UNKNOWN
        return None
    if reshuffles_each_iteration(dataset):
        return None
    return dataset.repeat()


def reshuffles_each_iteration(dataset) -> bool:
    """Whether a `shuffle` (by default it reshuffles) or a `Dataset.random` that rerandomizes in
    `dataset`'s chain of inputs draws a new seed for each iterator made."""
    stack, seen = [dataset], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if getattr(node, "_reshuffle_each_iteration", False) is not False or \
                getattr(node, "_rerandomize", None):
            return True
        stack.extend(node._inputs())
    return False


# ------------------------------------------------------------------ 2. PyDataset
class EpochCount:
    """The epochs a PyDataset adapter has begun (Keras calls its `on_epoch_begin` at each)."""

    def __init__(self, adapter):
        self.value = 0
        begin = adapter.on_epoch_begin

        def on_epoch_begin():
            self.value += 1
            begin()

        adapter.on_epoch_begin = on_epoch_begin


# How Keras orders a shuffled PyDataset's batches on one device, by version (read in each
# release's py_dataset_adapter.py): one random.shuffle of Python's `random` per epoch; from 3.16 a
# `random.Random` seeded by the adapter's count of ended epochs (`_epoch`: 1 at the first epoch
# of a fit, measured, after the pass that builds the model). Keras 3.5 passes that order through an
# unseeded tf.data shuffle(8) of the batches as well: one device's order cannot be drawn again.
PYDATASET_ORDERS = {("3.0.0", "3.5.99"): None, ("3.6.0", "3.15.99"): "python random",
                    ("3.16.0", versions.KERAS_RANGE[1]): "epoch index"}


def pydataset_order() -> str | None:
    """The running Keras's way (`PYDATASET_ORDERS`), None where it cannot be drawn again."""
    return versions.for_running_keras(PYDATASET_ORDERS)


def ordered_batches(adapter, seed: int | None, epochs: EpochCount):
    """A generator of the adapter's batches for the epoch beginning now: in one order on every
    worker, loaded by the dataset's `workers` threads ahead of use (at most `max_queue_size`),
    yielded in order. Shuffled as Keras shuffles them on one device (`pydataset_order`) where
    `seed` is None; else with `seed` and the epoch."""
    dataset = adapter.py_dataset
    order = list(range(dataset.num_batches))
    if adapter.shuffle and seed is not None:
        random.Random(seed + epochs.value).shuffle(order)
    elif adapter.shuffle and pydataset_order() == "epoch index":
        random.Random(adapter._epoch).shuffle(order)  # Keras's own count, as Keras seeds it
    elif adapter.shuffle:
        random.shuffle(order)
    ahead = max(1, dataset.max_queue_size)
    with futures.ThreadPoolExecutor(max(1, dataset.workers)) as pool:
        loading = [pool.submit(dataset.__getitem__, i) for i in order[:ahead]]
        for position in range(len(order)):
            batch = loading[position].result()
            if position + ahead < len(order):
                loading.append(pool.submit(dataset.__getitem__, order[position + ahead]))
            loading[position] = None
            yield adapter._standardize_batch(batch)


def pydataset_shares(adapter, seed: int, epochs: EpochCount, context):
    """This pipeline's shares of every batch of a finite PyDataset, in `ordered_batches`'s order
    (each worker loads every batch and keeps its replicas' rows, as DATA sharding did)."""
    import tensorflow as tf

    return batch_shares(tf.data.Dataset.from_generator(
        lambda: ordered_batches(adapter, seed, epochs),
        output_signature=adapter._output_signature), context)


def batch_shares(batches, context):
    """This pipeline's shares of each global batch of `batches` (one element per replica per
    batch, an empty share included, so every worker's pipeline ends at the same step)."""
    import tensorflow as tf

    return without_autotune(pipeline_shares(batches, context, lambda element, replica: share(
        element, replica, context.num_replicas_in_sync)).prefetch(tf.data.AUTOTUNE))


# ------------------------------------------------------------------ 5. Python generators
def generator_shares(adapter, context):
    """This pipeline's shares of every global batch Keras's generator adapter yields: each
    worker runs the generator and keeps its replicas' rows, as DATA sharding did."""
    return batch_shares(adapter.get_tf_dataset(), context)


def copied_batches(source):
    """Keras's generator adapter's `source` of batches (a function returning an iterator of them;
    in Keras 3.5 the iterator itself), yielding copies of the batches' arrays: TensorFlow
    may write into what it is given, never into the user's memory."""
    import keras
    import numpy as np

    def copied(leaf):
        return np.array(leaf, copy=True) if isinstance(leaf, np.ndarray) else leaf

    def copies(batches):
        for batch in batches:
            yield keras.tree.map_structure(copied, batch)

    return (lambda: copies(source())) if callable(source) else copies(source)


# ------------------------------------------------------------------ 3. files and workers
def files_read(dataset) -> int | None:
    """The fewest files any file reader of `dataset` reads, where every reader's file list has a
    known length; None when it reads no file or a list of unknown length."""
    counts, pending = [], [dataset]
    while pending:
        node = pending.pop()
        inputs = list(node._inputs())
        if type(node).__name__ in READERS and inputs:
            counts.append(int(inputs[0].cardinality()))
        else:
            pending += inputs
    return min(counts) if counts and min(counts) >= 0 else None


def file_sharding(dataset, workers: int, say: bool = True):
    """`dataset`, sharded by DATA where FILE sharding (AUTO's first choice) would fail for want
    of files (said in one line where `say`: the chief); an explicit FILE policy with too few
    files is refused; None where FILE sharding works or does not apply."""
    import tensorflow as tf

    policy = dataset.options().experimental_distribute.auto_shard_policy
    Policy = tf.data.experimental.AutoShardPolicy
    files = files_read(dataset) if policy in (Policy.AUTO, Policy.FILE) else None
    if files is None or files >= workers:
        return None
    fix = (f"write the records into at least {workers} files (one or more per worker), or set "
           "tf.data.Options().experimental_distribute.auto_shard_policy = "
           "AutoShardPolicy.DATA")
    if policy == Policy.FILE:
        raise ValueError(f"the dataset reads {files} file(s) for {workers} workers with "
                         f"AutoShardPolicy.FILE: some worker would read none. Fix: {fix}")
    if say:
        logger.info("kdist: the dataset reads %d file(s) for %d workers: each worker reads every "
                    "record and keeps its share (sharded by DATA). To read only its own, %s",
                    files, workers, fix.split(", or")[0])
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = Policy.DATA
    return dataset.with_options(options)
