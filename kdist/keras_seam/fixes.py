"""The upstream Keras 3 / TensorFlow bugs kdist fixes, each registered with its report, range and
the reason (`Patch(kind=FIX)`), and shown to exist upstream by a regression test.

>>> from kdist.keras_seam import patches
>>> active = patches.ensure()           # what kdist.scope() does
>>> "scalar_metric_reduce" in active
True
"""

from __future__ import annotations

import contextvars
import functools
import logging

from kdist import global_state
from kdist.keras_seam import inputs, keras_internals, one_device_fixes, tf_internals, versions
from kdist.keras_seam.callbacks import FILE_CALLBACKS
from kdist.keras_seam.hooks import connected
from kdist.keras_seam.registry import FIX, Patch, Target
from kdist.keras_seam.saving import MODEL_FILES
from kdist.keras_seam.strategy_kinds import is_multi_worker, is_parameter_server

logger = logging.getLogger("kdist")


# ----------------------------------------------------------------------------------------------
# 1. `_maybe_symbolic_build` all-reduces the first batch just to learn its shapes. Under MWMS the
#    cross-worker `strategy.reduce(MEAN, <nested PerReplica>, axis=None)` cannot convert the
#    PerReplica structure and raises "Attempt to convert a value (PerReplica...) with an unsupported
#    type" (flat inputs and dict inputs alike). Shapes need no collective, nor a batch: build from
#    the spec of one replica's batch. Reading a batch made an iterator of its own, and for a Python
#    generator (which every iterator of Keras's dataset shares) that iterator's prefetch took the
#    generator's next batches from training (a 5-step fit skipped 4 batches), under Mirrored too.
def _symbolic_build_without_collective(original):
    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if keras_internals.strategy_of(self) is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        spec = keras_internals.distributed_dataset(iterator).element_spec
        return original(self, iterator=None, data_batch=tf_internals.one_replica_spec(spec))

    return _maybe_symbolic_build


# ----------------------------------------------------------------------------------------------
# 2. `reduce_per_replica(..., "mean")` reduces every step's logs with `strategy.reduce("MEAN", v,
#    axis=0)` under multi-worker collectives; the logs are scalars, so TF raises "Invalid reduction
#    dimension 0 for input with 0 dimensions". Scalars are averaged with axis=None, the float32
#    ones together at the `mean_of_logs` hook (kdist: one collective for them all); tensors keep
#    Keras's behaviour.
def _scalar_reduce(original):
    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        import keras
        import tensorflow as tf

        if reduction not in ("auto", "mean") or not is_multi_worker(strategy):
            return original(values, strategy, reduction)
        flat = keras.tree.flatten(values)
        logs = [k for k, v in enumerate(flat) if v.shape.rank == 0 and v.dtype == tf.float32]
        reduced = [strategy.reduce("MEAN", v, axis=None if v.shape.rank == 0 else 0)
                   if k not in logs else None for k, v in enumerate(flat)]
        several = global_state.process().tracing_several_steps
        means = connected().mean_of_logs(strategy, [flat[k] for k in logs],
                                         one_step_per_call=not several)
        for k, mean in zip(logs, means):
            reduced[k] = mean
        return keras.tree.pack_sequence_as(values, reduced)

    return reduce_per_replica


def _after_epoch_iterator_init(adjust):
    """A fix of `TFEpochIterator.__init__`: Keras's, then ``adjust(iterator, strategy)``, which
    may replace the iterator's distributed dataset or change its adapter. Keras's distribution of
    its dataset is deferred (`_Pending`) until the outermost fix returns: a dataset a fix replaces
    is never distributed (it was, up to three times per fit under MultiWorkerMirrored), and an
    adapter's dataset whose building waits (`_built_when_distributed`) is never built."""
    def make(original):
        @functools.wraps(original)
        def __init__(self, distribute_strategy=None, *args, **kwargs):
            outermost = not isinstance(distribute_strategy, _Deferring)
            if not outermost:
                return _init_and_adjust(self, original, adjust, distribute_strategy, args, kwargs)
            deferring = _deferring.set(True)
            try:
                _init_and_adjust(self, original, adjust, _Deferring(distribute_strategy), args,
                                 kwargs)
            finally:
                _deferring.reset(deferring)
            if isinstance(self._distributed_dataset, _Pending):
                self._distributed_dataset = self._distributed_dataset.distributed()

        return __init__

    return make


def _init_and_adjust(iterator, original, adjust, deferring, args, kwargs):
    original(iterator, deferring, *args, **kwargs)
    iterator._distribute_strategy = deferring.strategy
    adjust(iterator, deferring.strategy)


class _Deferring:
    """The strategy as Keras's `TFEpochIterator.__init__` sees it: its
    `experimental_distribute_dataset` only notes the dataset (`_Pending`)."""

    def __init__(self, strategy):
        self.strategy = strategy

    def experimental_distribute_dataset(self, dataset, options=None):
        return _Pending(self.strategy, dataset, options)

    def __getattr__(self, name):
        return getattr(self.strategy, name)


class _Pending:
    """A dataset Keras would distribute: built (if it waits, `_Unbuilt`), changed by the fixes'
    `then` in turn and distributed, once no fix replaced it."""

    def __init__(self, strategy, dataset, options=None):
        self.strategy, self.dataset, self.options = strategy, dataset, options
        self._changes: list = []

    def then(self, change) -> None:
        """Distributes ``change(dataset)`` instead of the dataset."""
        self._changes.append(change)

    def distributed(self):
        dataset = self.dataset.built() if isinstance(self.dataset, _Unbuilt) else self.dataset
        for change in self._changes:
            dataset = change(dataset)
        return self.strategy.experimental_distribute_dataset(dataset, self.options)


class _Unbuilt:
    """An adapter's dataset, built when it is distributed (`_Pending`)."""

    def __init__(self, build):
        self.built = build


_deferring = contextvars.ContextVar("kdist_epoch_iterator_deferring", default=False)


def _built_when_distributed(original):
    """An adapter's `get_tf_dataset` inside the fixes of `TFEpochIterator.__init__`: its dataset
    is built only if no fix replaces it."""
    @functools.wraps(original)
    def get_tf_dataset(self):
        if _deferring.get():
            return _Unbuilt(functools.partial(original, self))
        return original(self)

    return get_tf_dataset


# ----------------------------------------------------------------------------------------------
# 3. Under a strategy of several replicas TensorFlow reads a dataset through a MultiDeviceIterator,
#    and deleting one waits until the autotuning thread of the dataset it reads next wakes up
#    (`RootDataset::Iterator`'s destructor, gdb): up to the thread's optimization period, which
#    doubles as the iterator lives. Every fit, evaluate and predict ends with that wait (1.1-1.4 s
#    after a 3 s fit on 2 workers here; a plain tf.data iterator never waits). The iterator of
#    each device waits the same way for its own autotuning thread (5 of 25 deletions, up to 1.25 s,
#    over a dataset without autotuning). The datasets Keras builds from arrays and generators, and
#    TensorFlow's per-device datasets (a generator over the MultiDeviceIterator and a prefetch of
#    one element: nothing to tune), are read without the autotuning model; a user's own tf.data
#    pipeline keeps the options its author chose.
def _distributed_reads_end_at_once(iterator, strategy):
    from kdist.keras_seam import classes

    built_by_keras = tuple(classes.resolve(name) for name in (
        "ArrayDataAdapter", "GeneratorDataAdapter"))
    pending = iterator._distributed_dataset
    if (isinstance(iterator.data_adapter, built_by_keras) and isinstance(pending, _Pending)
            and strategy is not None and strategy.num_replicas_in_sync > 1):
        pending.then(inputs.without_autotune)


def _device_dataset_without_autotune(original):
    @functools.wraps(original)
    def _create_device_dataset(*args, **kwargs):
        return inputs.without_autotune(original(*args, **kwargs))

    return _create_device_dataset


# ----------------------------------------------------------------------------------------------
# 4. fit's input under MultiWorkerMirrored (`kdist.keras_seam.inputs`): in-memory arrays shuffled
#    by one seed on every worker (Keras <= 3.15 shuffles each worker's differently; Keras's own
#    dataset of them, replaced, is never built: 50-120 ms of the first epoch here), a PyDataset's
#    batches loaded in one order on every worker, a dataset of fewer files than workers sharded
#    by DATA where FILE sharding would fail, one iterator across epochs where an epoch's
#    batches are counted, and (under Mirrored too) a generator's batches copied before
#    TensorFlow, which may write into them, sees them.
def _consistent_array_shuffle(iterator, strategy):
    from kdist.keras_seam import classes

    adapter = iterator.data_adapter
    if (isinstance(adapter, classes.resolve("ArrayDataAdapter")) and adapter._shuffle
            and is_multi_worker(strategy)):
        seed = inputs.shared_seed(connected().cluster_of(strategy))
        # a program seeded alike on every worker: one device's order; else the shared seed's
        order = None
        if global_state.process().tensorflow_seed_agrees:
            token = _deferring.set(False)  # Keras's own dataset of the row indices, built now
            try:
                order = inputs.keras_order(inputs.row_indices(adapter).get_tf_dataset())
            finally:
                _deferring.reset(token)
        iterator._distributed_dataset = inputs.Continuing(
            strategy.distribute_datasets_from_function(
                lambda context: inputs.array_shares(adapter, seed, context, order)))


def _consistent_pydataset_order(iterator, strategy):
    from kdist.keras_seam import classes

    adapter = iterator.data_adapter
    if (isinstance(adapter, classes.resolve("PyDatasetAdapter"))
            and adapter.py_dataset.num_batches is not None
            and strategy.num_replicas_in_sync > 1
            and not is_parameter_server(strategy)):
        adapter.enqueuer = None  # not started yet: kdist's generator loads with its threads
        seed = _pydataset_seed(adapter, strategy)
        epochs = inputs.EpochCount(adapter)
        iterator._distributed_dataset = _shares_ending_together(
            iterator, strategy,
            lambda context: inputs.pydataset_shares(adapter, seed, epochs, context))


def _pydataset_seed(adapter, strategy) -> int | None:
    """None: a PyDataset's batches are shuffled as on one device (`inputs.pydataset_order`:
    by the epoch's index, or by Python's `random` in one process or on workers whose `random`
    agreed at the fit's start); else the workers' shared seed, said once where seeding the
    program would give one device's order."""
    order = inputs.pydataset_order()
    if order == "epoch index" or order == "python random" and (
            not is_multi_worker(strategy) or global_state.process().python_random_agrees):
        return None
    if order is not None and adapter.shuffle and not global_state.process().python_random_said:
        global_state.process().python_random_said = True
        logger.warning(
            "kdist: the workers' Python random states differ at fit's start (the program seeds "
            "none), so a PyDataset's batches are shuffled by a seed the workers share, in an "
            "order one device would not draw; keras.utils.set_random_seed(n) before the model "
            "is built gives one device's order")
    return inputs.shared_seed(connected().cluster_of(strategy))


def _generator_batches_copied(iterator, strategy):
    from kdist.keras_seam import classes

    adapter = iterator.data_adapter
    if (isinstance(adapter, classes.resolve("GeneratorDataAdapter")) and strategy is not None
            and strategy.num_replicas_in_sync > 1):
        adapter.generator = inputs.copied_batches(adapter.generator)  # read per iterator


def _generator_shares_end_together(iterator, strategy):
    from kdist.keras_seam import classes

    adapter = iterator.data_adapter
    if isinstance(adapter, classes.resolve("GeneratorDataAdapter")) and is_multi_worker(strategy):
        iterator._distributed_dataset = _shares_ending_together(
            iterator, strategy, lambda context: inputs.generator_shares(adapter, context))


def _shares_ending_together(iterator, strategy, shares):
    """kdist's `shares(context)` (every worker yields one share per replica for every global
    batch, so all run out at the same step) distributed by `strategy`, read without the per-step
    agreement on the data's end where each call of the step reads one batch, first thing
    (`tf_internals.ending_together`): the end is then an OutOfRange before any collective of the
    call. With several steps per execution a later read would end the call halfway, after its
    first steps' collectives: the agreement stays."""
    distributed = strategy.distribute_datasets_from_function(shares)
    if iterator.steps_per_execution != 1:
        return distributed
    return tf_internals.ending_together(distributed)


def _is_tf_data(dataset) -> bool:
    """A tf.data dataset (not one the user distributed already)."""
    import tensorflow as tf

    return isinstance(dataset, tf.data.Dataset)


def _tf_data_under_multi_worker(iterator, strategy):
    from kdist.keras_seam import classes

    adapter = iterator.data_adapter
    dataset = adapter.get_tf_dataset() if isinstance(
        adapter, classes.resolve("TFDatasetAdapter")) else None
    if _is_tf_data(dataset) and is_multi_worker(strategy):
        resharded = inputs.file_sharding(
            dataset, tf_internals.num_workers(strategy),
            say=connected().cluster_of(strategy).is_chief)
        continuing = inputs.continuing_epochs(resharded or dataset, iterator.steps_per_epoch)
        if continuing is not None:
            iterator._distributed_dataset = inputs.Continuing(
                strategy.experimental_distribute_dataset(continuing))
        elif resharded is not None:
            iterator._distributed_dataset = strategy.experimental_distribute_dataset(resharded)


# ----------------------------------------------------------------------------------------------
# 5. Keras 3's `Variable.assign_add/assign_sub` is `assign(self + value)`: a read-modify-write.
#    Under ParameterServerStrategy the workers update the same ps variables concurrently, so
#    increments are lost: metrics come out wrong (accuracy 1.12 measured) and
#    `optimizer.iterations` undercounts. Under PSS, kdist uses the variable's own
#    assign_add/assign_sub, which the ps applies atomically.
def _atomic(name: str):
    def make(original):
        @functools.wraps(original)
        def method(self, value):
            import tensorflow as tf
            from keras.src.backend.common.stateless_scope import in_stateless_scope

            if (self._value is None or in_stateless_scope()
                    or not is_parameter_server(tf.distribute.get_strategy())):
                return original(self, value)
            value = self._convert_to_tensor(value, dtype=self.dtype)
            return getattr(self._value, name)(value)

        return method

    return make


# ----------------------------------------------------------------------------------------------
# 6. `steps_per_execution > 1` under Mirrored and MultiWorkerMirrored: Keras runs each execution's
#    steps in a `tf.while_loop` whose body calls the distributed step inside a `tf.cond`; TF then
#    fails with "You must feed a value for placeholder tensor '...while/cond/Placeholder...'"
#    (Keras <= 3.6 unrolled the steps in Python and has no such loop). Under those strategies kdist
#    keeps Keras's loop but takes the step out of the cond: the loop's condition checks that a
#    next batch exists, the body runs the step on it and (a cond over the iterator only) fetches
#    the one after while steps remain. The first batch is read with `get_next()`: at the end of the
#    data its OutOfRangeError ends the epoch, as Keras's epoch iterator expects; the first step
#    waits for that batch (control dependencies), or the optimizer's step count, which reads no
#    data, went one up at every end of a generator's data (iterations 5 where one device has 4).
def _multi_step_function(trainer, step_function):
    import tensorflow as tf

    from kdist.keras_seam import classes

    strategy = trainer.distribute_strategy
    reduce_per_replica = classes.resolve("trainer module").reduce_per_replica

    def one_step(data):
        outputs = strategy.run(step_function, args=(data,))
        return reduce_per_replica(outputs, strategy, reduction="auto")

    @tf.autograph.experimental.do_not_convert
    def steps(iterator):
        global_state.process().tracing_several_steps = True  # read by reduce_per_replica (fix 2)
        try:
            return several(iterator)
        finally:
            global_state.process().tracing_several_steps = False

    def several(iterator):
        k = trainer.steps_per_execution
        data = iterator.get_next()
        with tf.control_dependencies(tf.nest.flatten(data, expand_composites=True)):
            outputs = one_step(data)  # nothing of it runs (the optimizer's step count) without data

        def more(step, outputs, following):
            return tf.logical_and(step < k, following.has_value())

        def body(step, outputs, following):
            outputs = one_step(following.get_value())
            following = tf.cond(step + 1 < k, iterator.get_next_as_optional, lambda: following)
            return step + 1, outputs, following

        _, outputs, _ = tf.while_loop(more, body,
                                      [tf.constant(1), outputs, iterator.get_next_as_optional()])
        return outputs

    return steps if trainer.run_eagerly else tf.function(steps, reduce_retracing=True)


def _steps_per_execution(original):
    @functools.wraps(original)
    def _make_function(self, step_function):
        strategy = self.distribute_strategy
        if self.steps_per_execution == 1 or strategy.num_replicas_in_sync == 1 or \
                is_parameter_server(strategy):
            return original(self, step_function)
        return _multi_step_function(self, step_function)

    return _make_function


# ----------------------------------------------------------------------------------------------
# 7. Keras < 3.8 does not scale the loss for distribution: each replica's gradient is that of its
#    mean loss, tf.distribute sums them across replicas, so every update is N times too large with
#    N replicas (fixed in Keras 3.8 by keras-team/keras#20609). kdist divides the loss by the
#    replicas in sync where the stock train_step turns it into gradients, `optimizer.scale_loss`
#    (also LossScaleOptimizer's); the logged loss is unchanged.
def _loss_scaled_per_replica(original):
    @functools.wraps(original)
    def scale_loss(self, loss):
        import tensorflow as tf

        loss = original(self, loss)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return loss if replicas == 1 else loss * (1.0 / replicas)

    return scale_loss


# ----------------------------------------------------------------------------------------------
# 8. Keras < 3.10 creates metric variables as ordinary (mirrored) variables: each worker keeps its
#    own counts, so two MWMS workers log different losses and `evaluate` reports one worker's
#    share of the data (Keras 3.10 creates them synchronised on read, keras-team/keras#21072).
#    kdist creates them per replica and combined on read, with the metric's own aggregation, also
#    when Keras defers creating the tf.Variable (compiled metrics are built in a stateless scope).
def _metric_add_variable(original):
    @functools.wraps(original)
    def add_variable(self, shape, initializer, dtype=None, aggregation="sum", name=None):
        combine = aggregation if aggregation in ("sum", "mean") else "sum"
        with keras_internals.per_replica_variables(combine):
            variable = original(self, shape, initializer, dtype=dtype, aggregation=aggregation,
                                name=name)
        variable._kdist_on_read = combine  # for a deferred creation, below
        return variable

    return add_variable


def _deferred_initialize(original):
    @functools.wraps(original)
    def initialize(self, value_or_initializer):
        combine = getattr(self, "_kdist_on_read", None)
        if combine is None:
            return original(self, value_or_initializer)
        with keras_internals.per_replica_variables(combine):
            return original(self, value_or_initializer)

    return initialize


# ----------------------------------------------------------------------------------------------
# 9. TensorFlow 2.22: a parameter-server chief whose worker died during training can hang at exit.
#    As the interpreter ends, each traced function's finalizer asks the runtime to remove it from
#    every task it ran on; the request to the dead worker (EagerContext::
#    MaybeRemoveFunctionRemotely -> GrpcEagerClient::StreamingEnqueueAsync) waits without a
#    deadline (gdb on the live chief). Seen in 1 of 3 runs here, never on TF 2.21. At exit kdist
#    turns the finalizers' removal off: the process is ending, the servers exit with the chief,
#    and there is nothing left to remove functions from.
def _leaves_without_remote_removal(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        import atexit

        original(self, *args, **kwargs)
        atexit.register(tf_internals.skip_remote_function_removal)

    return __init__


# ----------------------------------------------------------------------------------------------
# 10. `predict_on_batch(x)` under several replicas runs the whole undistributed batch on every
#    replica and concatenates their outputs: 64 rows in, 128 out under 2 replicas (Mirrored and
#    MultiWorkerMirrored alike). kdist predicts the batch as `predict` does, one batch of its rows
#    split over the replicas, in input order.
def _predict_on_batch_distributed(original):
    @functools.wraps(original)
    def predict_on_batch(self, x):
        import keras
        import tensorflow as tf

        strategy = keras_internals.strategy_of(self)
        if strategy is None or strategy.num_replicas_in_sync == 1 or \
                is_parameter_server(strategy):
            return original(self, x)
        rows = int(tf.shape(keras.tree.flatten(x)[0])[0])
        return self.predict(x, batch_size=max(rows, 1), verbose=0)

    return predict_on_batch


# ----------------------------------------------------------------------------------------------
# 11. Keras < 3.8 reduces a loss over an empty batch to 0 / 0: a replica whose share of a short
#     last batch is empty logs a NaN loss for the whole epoch (its weights stay right: an empty
#     share's gradient is zeros). Later Keras divides with divide_no_nan. kdist makes an empty
#     batch's loss 0, as one device never sees it.
def _empty_batch_loss_zero(original):
    @functools.wraps(original)
    def reduce_values(values, *args, **kwargs):
        import tensorflow as tf

        loss = original(values, *args, **kwargs)
        if not tf.is_tensor(loss) or loss.shape.rank != 0 or values.shape.rank == 0:
            return loss
        return tf.where(tf.size(values) > 0, loss, tf.zeros_like(loss))

    return reduce_values


# 12. Keras >= 3.7 makes two iterators over fit's dataset for every epoch whose size it knows
#     (arrays, a PyDataset, a dataset of known cardinality) when no steps_per_epoch is given: one
#     at the epoch's end, for the next epoch, and one at the next epoch's start, which replaces
#     it unread; after the last epoch the first is made for nothing. Under Mirrored each is a
#     MultiDeviceIterator, whose making and deletion cost about 50 ms here (a 10-epoch fit of 8
#     steps per epoch on 2 logical CPUs: 1.9 s upstream, 1.4 s fixed). An epoch's iterator is
#     now made when its first batch is read: one per epoch, none after the last. (Under
#     MultiWorkerMirrored kdist's own inputs already read one iterator for the whole fit.)
#     Making an iterator is not free of effects: a tf.data shuffle that reshuffles each iteration
#     (and any op drawing from a seed generator) takes the next seed when an iterator is made, so
#     one device's epoch e trains draw 2e - 1. The iterator left unread at an epoch's end still
#     draws its seed, from a plain iterator of the user's dataset (no MultiDeviceIterator; one
#     device makes it too); where `steps_per_epoch` keeps it for the next epoch, it is made then.
def _iterator_made_on_first_read(original):
    """`TFEpochIterator._get_iterator`: an `_Unmade` iterator over the dataset (Keras's `iter()`
    of it is itself); at an epoch's end, as many seeds drawn as one device draws."""
    @functools.wraps(original)
    def _get_iterator(self):
        dataset = original(self)
        if self._current_iterator is None or isinstance(self._current_iterator, _Unmade):
            return _Unmade(dataset)  # an epoch's start: its first read follows at once
        if self.steps_per_epoch is not None:  # the next epoch reads this one
            return iter(dataset)
        _draw_seeds_as_one_device(self.data_adapter)
        return _Unmade(dataset)

    return _get_iterator


def _draw_seeds_as_one_device(adapter) -> None:
    """Makes (and drops, unread) an iterator of a user's tf.data dataset: its shuffles and other
    seed generators draw as they do for the iterator one device makes here."""
    from kdist.keras_seam import classes

    if isinstance(adapter, classes.resolve("TFDatasetAdapter")):
        dataset = adapter.get_tf_dataset()
        if _is_tf_data(dataset):
            iter(dataset)


def _first_read_makes_the_iterator(original):
    """`TFEpochIterator.__next__`: the step's iterator, made if it was not yet."""
    @functools.wraps(original)
    def __next__(self):
        step = original(self)
        unmade = step[-1]
        if not isinstance(unmade, _Unmade):
            return step
        iterator = unmade.made()
        if self._current_iterator is unmade:
            self._current_iterator = iterator
        return (*step[:-1], iterator)

    return __next__


class _Unmade:
    """An iterator over `dataset` not made yet: `made()` makes it, once."""

    def __init__(self, dataset):
        self.dataset, self._iterator = dataset, None

    def made(self):
        if self._iterator is None:
            self._iterator = iter(self.dataset)
        return self._iterator

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.made())



# ----------------------------------------------------------------------------------------------
# 13. Keras's TensorFlow `Variable._direct_assign` calls `tf.Variable.assign` with its default
#     `read_value=True` and drops what it returns. On a SyncOnRead variable (every metric's, under
#     a strategy) TensorFlow reads the assigned value back in cross-replica context: a reduce of
#     every replica's copy, under MultiWorkerMirrored an eager collective across the workers.
#     `reset_metrics()` at each epoch's start (fit, evaluate) ran one per metric variable, each
#     waiting for every worker and leaving about 2 KB of TensorFlow's memory behind (measured: 2,000
#     eager reads of a SyncOnRead variable on 2 workers grew each by 2,067 B a read), the most of
#     what a long fit of short epochs grew beyond plain Keras's (benchmarks/soak.py). The value is
#     assigned without the read back.
def _assign_without_read_back(original):
    @functools.wraps(original)
    def _direct_assign(self, value):
        import tensorflow as tf

        variable = self._value
        if not (isinstance(variable, tf.distribute.DistributedValues)
                and variable.synchronization == tf.VariableSynchronization.ON_READ):
            return original(self, value)
        variable.assign(tf.cast(value, variable.dtype), read_value=False)

    return _direct_assign


# ----------------------------------------------------------------------------------------------
# 14. TensorFlow's `context.executor_scope(e)` saves the thread's executor as a Python `Executor`
#    whose `__del__` waits for every pending node of it, and for a thread without an executor of
#    its own that is the context's default executor, shared by all threads. The parameter-server
#    coordinator runs each closure in such a scope, so each worker's thread, leaving it, waits
#    for whatever is pending on the default executor: among it, the deletion of a tensor that
#    lives on another worker (a step's output, a model's per-worker resources after a garbage
#    collection), which waits without a deadline for that worker's answer. One worker frozen
#    (SIGSTOP, a paused VM) at such a moment held every worker's next step: ksync:2 made 1
#    update in 10 s after 5 of 15 stops here (stacks: each worker's thread in
#    `Executor.__del__` -> `WaitForAllPendingNodes`), 0 of 20 with the fix. kdist restores the
#    thread's executor without waiting for it.
def _executor_restored_without_waiting(original):
    @functools.wraps(original)
    def executor_scope(executor):
        return tf_internals.executor_scope(executor)

    return executor_scope


# ----------------------------------------------------------------------------------------------
# 15. Keras <= 3.8's fit does not recognise the dataset `strategy.distribute_datasets_from_function`
#    returns (its `is_tf_dataset` lists `DistributedDataset` only): the tutorials' input-function
#    idiom fails with "Unrecognized data type". The rest of fit already takes it (it is a
#    `tf.distribute.DistributedDataset`, used as given). Fixed in Keras 3.9 (keras#20829).
def _datasets_from_function_recognised(original):
    @functools.wraps(original)
    def is_tf_dataset(x):
        return original(x) or any(
            parent.__name__ == "DistributedDatasetsFromFunction"
            and parent.__module__.startswith("tensorflow.python.") for parent in type(x).__mro__)

    return is_tf_dataset


# 16. Keras's Embedding looks its table up with `ops.take(self.embeddings, ids)`, and Keras's
#     TensorFlow `take` converts the variable to a tensor first: every step reads the whole table
#     (a ReadVariableOp) and gathers from that copy. The gradient is still rows (IndexedSlices),
#     but when the optimizer then writes those rows into the variable while the step's read
#     still holds the table's buffer, TensorFlow copies the whole table before writing (copy on
#     write): a step of a 500,000 x 64 table with SGD took 27-30 ms here, 4 ms reading only the
#     rows (one process, 256 x 20 ids). A take of rows (axis 0, dense ids) from a variable that is
#     not cast on read now gathers from the variable itself (`ResourceGather`), the same values
#     and the same gradient; anything else goes to Keras's take.
def _take_rows_of_a_variable(original):
    @functools.wraps(original)
    def take(x, indices, axis=None):
        import tensorflow as tf

        table = _uncast_variable(x)
        if table is None or axis != 0 or isinstance(indices, (tf.SparseTensor, tf.RaggedTensor)):
            return original(x, indices, axis=axis)
        ids = tf.convert_to_tensor(indices)
        if not ids.dtype.is_integer:
            return original(x, indices, axis=axis)
        rows = table.shape[0] if table.shape[0] is not None else tf.shape(table)[0]
        rows = tf.cast(rows, ids.dtype)  # the static size: a Shape would read the whole table
        return tf.gather(table, tf.where(ids < 0, ids + rows, ids))  # Keras's "fill" mode

    return take


def _uncast_variable(x):
    """The TensorFlow variable `x` is (a Keras variable's, read without a cast), else None."""
    import tensorflow as tf
    from kdist.keras_seam import classes

    if isinstance(x, classes.resolve("Variable")):
        x = x.value  # a cast tensor under autocast, a tensor in a stateless scope
    if isinstance(x, tf.distribute.DistributedValues) and \
            tf.distribute.get_replica_context() is not None:
        x = x._get_on_device_or_primary()  # a replica's step: its own copy (a MirroredVariable
        # would be read whole, then gathered)
    return x if isinstance(x, tf.Variable) else None


# 17. TensorFlow's CPU scatter_add/scatter_sub sum the rows of repeated indices in an order that
#     depends on its threads: the same update applied twice differs by up to 7e-7 here (20,480
#     rows over 1,000 indices). Every replica applies the same summed sparse gradient, so under
#     several replicas the copies drift apart (an Embedding of 1,000 rows, 512 x 20 ids, SGD:
#     3.7e-9 after 2 epochs, Mirrored) and kdist's replica check stops the fit. Under several
#     replicas the optimizer's sparse add/subtract sums the rows of each index first (one row per
#     index, in a fixed order), then scatters: the same update, the same on every replica.
def _rows_merged_before_scatter(original):
    @functools.wraps(original)
    def method(self, variable, value):
        import tensorflow as tf

        if isinstance(value, tf.IndexedSlices) and \
                tf.distribute.get_strategy().num_replicas_in_sync > 1:
            value = merged_rows(value)
        return original(self, variable, value)

    return method


def merged_rows(value):
    """`value` (IndexedSlices) with one row per index: the rows of each index summed, in the
    order the indices first appear."""
    import tensorflow as tf

    rows, position = tf.unique(value.indices)
    return tf.IndexedSlices(tf.math.unsorted_segment_sum(value.values, position, tf.shape(rows)[0]),
                            rows, value.dense_shape)


FIXES = [
    Patch("symbolic_build_without_collective", FIX,
          {Target("Trainer", "_maybe_symbolic_build"): _symbolic_build_without_collective},
          upstream="keras-team/keras#20585, keras-team/keras#20329, tensorflow/tensorflow#72388",
          why="fit under MultiWorkerMirrored crashes on its first batch: Keras all-reduces it "
              "across workers only to learn its shapes"),
    Patch("scalar_metric_reduce", FIX, {Target("trainer module", "reduce_per_replica"): _scalar_reduce},
          upstream="keras-team/keras#20585",
          why="every step's logs under MultiWorkerMirrored fail: scalars reduced along axis 0"),
    Patch("distributed_reads_end_at_once", FIX,
          {Target("TFEpochIterator", "__init__"):
           _after_epoch_iterator_init(_distributed_reads_end_at_once),
           Target("multi-device iterator module", "_create_device_dataset"):
           _device_dataset_without_autotune},
          upstream="none filed; see kdist/keras_seam/fixes.py",
          why="every fit, evaluate and predict under several replicas ends waiting for "
              "tf.data's autotuning threads, the dataset's and each device's (up to their "
              "optimization period, seconds into a fit) before it returns"),
    Patch("consistent_array_shuffle", FIX,
          {Target("TFEpochIterator", "__init__"):
           _after_epoch_iterator_init(_consistent_array_shuffle),
           Target("ArrayDataAdapter", "get_tf_dataset"): _built_when_distributed},
          upstream="none filed; see kdist/keras_seam/inputs.py (Keras 3.16 shuffles with a "
                   "stateless seed per epoch, the same on every worker)",
          keras_versions=("3.5.0", "3.15.99"), fixed_in="3.16.0",
          why="fit(arrays, shuffle=True) under MultiWorkerMirrored: each worker shards its own "
              "permutation, so some examples train twice per epoch and others never"),
    Patch("consistent_pydataset_order", FIX,
          {Target("TFEpochIterator", "__init__"):
           _after_epoch_iterator_init(_consistent_pydataset_order)},
          upstream="none filed; see kdist/keras_seam/inputs.py",
          why="fit(PyDataset) under several replicas: each worker shuffles the batch order with "
              "its own unseeded random, and the iterator Keras makes at each epoch's end "
              "competes for the loader's batches, so some examples train twice per epoch and "
              "others never (MultiWorkerMirrored; Mirrored on a loaded machine)"),
    Patch("generator_batches_copied", FIX,
          {Target("TFEpochIterator", "__init__"):
           _after_epoch_iterator_init(_generator_batches_copied)},
          upstream="none filed; see kdist/keras_seam/inputs.py",
          why="fit(generator) under Mirrored overwrites the arrays the generator yields views "
              "of (those on 64 bytes, as large arrays are): every later pass trains on wrong "
              "data (TF 2.17 and 2.21; not reproduced on TF 2.22)"),
    Patch("generator_steps_without_end_agreement", FIX,
          {Target("TFEpochIterator", "__init__"):
           _after_epoch_iterator_init(_generator_shares_end_together)},
          upstream="none filed; see kdist/keras_seam/tf_internals.py (ending_together)",
          why="fit(generator) under MultiWorkerMirrored: every step all-reduces across workers "
              "whether any replica still has data (TensorFlow's partial-batch handling of a "
              "dataset of unknown length), one more collective in every step"),
    Patch("tf_data_under_multi_worker", FIX,
          {Target("TFEpochIterator", "__init__"):
           _after_epoch_iterator_init(_tf_data_under_multi_worker)},
          upstream="none filed; TensorFlow's AUTO policy raises instead of falling back to DATA",
          why="a dataset read from fewer files than workers fails at its first batch under "
              "MultiWorkerMirrored ('Could not apply FILE based sharding'), and each epoch's "
              "new iterator waits up to a second (the sharding rewrite of its graph)"),
    Patch("one_iterator_per_epoch", FIX,
          {Target("TFEpochIterator", "_get_iterator"): _iterator_made_on_first_read,
           Target("TFEpochIterator", "__next__"): _first_read_makes_the_iterator},
          upstream="none filed; see kdist/keras_seam/fixes.py (EpochIterator._enumerate_iterator)",
          keras_versions=("3.7.0", versions.KERAS_RANGE[1]),
          why="fit under Mirrored makes two distributed iterators per epoch, one never read "
              "(also after the last epoch): each costs tens of milliseconds at the epoch "
              "boundary and at fit's end"),
    Patch("atomic_assign_under_parameter_server", FIX,
          {Target("Variable", name): _atomic(name) for name in ("assign_add", "assign_sub")},
          upstream="none filed; see kdist/keras_seam/fixes.py",
          why="assign_add is a read-modify-write: concurrent parameter-server workers lose "
              "metric and iteration increments"),
    Patch("steps_per_execution_under_mirrored", FIX,
          {Target("Trainer", "_make_function"): _steps_per_execution},
          upstream="keras-team/keras#19246", keras_versions=("3.7.0", versions.KERAS_RANGE[1]),
          why="steps_per_execution > 1 under Mirrored strategies fails with a placeholder error "
              "(the distributed step inside a cond inside Keras's while_loop)"),
    Patch("loss_scaled_per_replica", FIX,
          {Target(owner, "scale_loss"): _loss_scaled_per_replica
           for owner in ("BaseOptimizer", "LossScaleOptimizer")},
          upstream="keras-team/keras#19891", keras_versions=("3.5.0", "3.7.99"), fixed_in="3.8.0",
          why="every update is N times too large with N replicas (the loss is not divided by them)"),
    Patch("metric_variables_synced_on_read", FIX,
          {Target("Metric", "add_variable"): _metric_add_variable,
           # where the TF backend creates the tf.Variable: both methods in Keras <= 3.9
           Target("Variable", "_initialize"): _deferred_initialize,
           Target("Variable", "_initialize_with_initializer"): _deferred_initialize},
          upstream="keras-team/keras#21061", keras_versions=("3.5.0", "3.9.99"), fixed_in="3.10.0",
          why="each MultiWorkerMirrored worker logs and evaluates its own share of the data"),
    Patch("multi_worker_file_callbacks", FIX, FILE_CALLBACKS,
          upstream="none filed (tf-keras had it); see kdist/keras_seam/callbacks.py",
          why="ModelCheckpoint, BackupAndRestore, TensorBoard and CSVLogger write from every "
              "worker to the same path (HDF5 lock errors, truncated files, interleaved logs)"),
    Patch("model_files_written_whole", FIX, MODEL_FILES,
          upstream="none filed (tf-keras's guide had users pick paths per worker); see "
                   "kdist/keras_seam/saving.py",
          why="model.save, save_weights and export from several workers at once collide on one "
              "path (HDF5 lock errors, files written over each other), and a crash or a full "
              "disk leaves a truncated file in place of the last good one"),
    Patch("batch_norm_statistics_averaged", FIX,
          {Target("BatchNormalization", "build"): one_device_fixes._statistics_averaged},
          upstream="none filed for Keras 3 (tf.keras 2 created them with aggregation MEAN); "
                   "see kdist/keras_seam/one_device_fixes.py",
          why="BatchNormalization's moving mean and variance differ between replicas and "
              "workers: each updates its own copy from its own part of the batch"),
    Patch("clip_after_all_reduce", FIX,
          {Target("BaseOptimizer", "_clip_gradients"): one_device_fixes._clip_deferred,
           Target("TFOptimizer", "_all_reduce_sum_gradients"): one_device_fixes._clip_summed},
          upstream="none filed for Keras 3 (tensorflow/tensorflow#33929 for tf.keras)",
          around_hooks=True,
          why="clipnorm, global_clipnorm and clipvalue clip each replica's part of the gradient "
              "before the sum, not the summed gradient one device clips"),
    Patch("loss_value_per_replica", FIX,
          {Target("loss module", "scale_loss_for_distribution"):
           one_device_fixes._scale_gradient_only,
           Target("loss module", "unscale_loss_for_distribution"):
           one_device_fixes._unscaled_already},
          upstream="keras-team/keras#16285 (tf.keras), unfixed in Keras 3",
          keras_versions=("3.8.0", versions.KERAS_RANGE[1]),
          why="a custom train_step's loss (compute_loss, a loss object) is 1/N of one device's, "
              "so its tracker, fit's logs and evaluate report 1/N of the loss"),
    Patch("gradient_accumulation_in_phases", FIX,
          {Target("BaseOptimizer", "_backend_apply_gradients"):
           one_device_fixes._accumulation_in_phases},
          upstream="keras-team/keras#20582",
          why="gradient_accumulation_steps under Mirrored strategies crashes: the all-reduce "
              "sits inside a cond"),
    Patch("loss_scale_finite_on_every_replica", FIX,
          {Target("LossScaleOptimizer", "check_finite"): one_device_fixes._finite_everywhere},
          upstream="none filed (Keras's comment assumes the gradients are already summed); see "
                   "kdist/keras_seam/one_device_fixes.py",
          why="mixed precision under several replicas applies a step whose summed gradient "
              "holds inf: each replica checks only its own part, the first one decides"),
    Patch("step_models_under_strategies", FIX,
          {Target("BaseTrainer", "_symbolic_build"): one_device_fixes._step_model_built,
           Target("BaseOptimizer", "apply"): one_device_fixes._built_across_replicas},
          upstream="keras-team/keras#20164",
          why="a model that is only a train_step over sub-models (keras.io's GAN) cannot be "
              "built under a strategy, and an optimizer first used inside the step fails"),
    Patch("random_draws_as_one_device", FIX,
          {**{Target("random module", name): one_device_fixes._rows_of_one_device
              for name in ("normal", "uniform", "truncated_normal", "randint", "binomial",
                           "gamma", "beta")},
           Target("random module", "dropout"): one_device_fixes._dropout_rows_of_one_device},
          upstream="none filed (keras-team/keras#20611 made the SeedGenerator's state the same "
                   "on every replica); see kdist/keras_seam/one_device_fixes.py",
          why="every replica draws the same dropout masks and noise for its share of the batch, "
              "where one device draws different numbers for every row of the global batch"),
    Patch("additional_loss_sums_as_one_device", FIX,
          {Target("Trainer", "_aggregate_additional_loss"):
           one_device_fixes._additional_loss_as_one_device},
          upstream="none filed (keras-team/keras#20609 divides every replica's loss by the "
                   "replicas); see kdist/keras_seam/one_device_fixes.py",
          keras_versions=("3.8.0", versions.KERAS_RANGE[1]),
          why="a penalty add_loss sums over the batch trains with 1/N of one device's gradient "
              "under N replicas (a mean over the batch is right)"),
    Patch("keras2_names", FIX,
          {Target("utils module", "experimental"): one_device_fixes._keras2_names},
          upstream="none: Keras 3 dropped tf.keras's keras.utils.experimental",
          why="the parameter-server tutorial's DatasetCreator raises a bare AttributeError; kdist "
              "says what to write in Keras 3"),
    Patch("predict_on_batch_under_replicas", FIX,
          {Target("Trainer", "predict_on_batch"): _predict_on_batch_distributed},
          upstream="none filed; see kdist/keras_seam/fixes.py",
          why="predict_on_batch under several replicas returns every replica's prediction of the "
              "whole batch: N times the rows"),
    Patch("empty_batch_loss_zero", FIX,
          {Target("loss module", "reduce_values"): _empty_batch_loss_zero},
          upstream="none filed (Keras 3.8 divides with divide_no_nan); see "
                   "kdist/keras_seam/fixes.py",
          keras_versions=("3.5.0", "3.7.99"), fixed_in="3.8.0",
          why="a replica whose share of a short last batch is empty logs a NaN loss (0 / 0) "
              "for the epoch"),
    Patch("metric_reset_without_collective", FIX,
          {Target("Variable", "_direct_assign"): _assign_without_read_back},
          upstream="none filed; see kdist/keras_seam/fixes.py",
          why="every epoch's metric reset under several replicas reduces each metric variable "
              "across the replicas to read back a value Keras drops: one collective per variable "
              "between the workers at every epoch's start, each leaving memory behind"),
    Patch("ps_steps_without_waiting_for_a_frozen_worker", FIX,
          {Target("eager context module", "executor_scope"): _executor_restored_without_waiting},
          upstream="none filed; see kdist/keras_seam/fixes.py",
          why="under ParameterServerStrategy, one worker frozen while a tensor of it is being "
              "deleted holds every other worker's steps until it goes on: each worker's "
              "thread, leaving a step, waits for the context's pending deletions"),
    Patch("datasets_from_function_in_fit", FIX,
          {Target("data adapters module", "is_tf_dataset"): _datasets_from_function_recognised},
          upstream="keras-team/keras#20134",
          keras_versions=(versions.KERAS_RANGE[0], "3.8.99"), fixed_in="3.9.0",
          why="fit rejects the dataset of strategy.distribute_datasets_from_function: "
              "'Unrecognized data type'"),
    Patch("embedding_rows_read_from_the_variable", FIX,
          {Target("backend numpy module", "take"): _take_rows_of_a_variable},
          upstream="none filed; keras-team/keras-core#229 moved Embedding to ops.take, which "
                   "converts the table to a tensor",
          why="every step with an Embedding reads its whole table, and a sparse update of the "
              "table then copies it whole (copy on write): 27-30 ms a step where reading the "
              "rows takes 4 ms (a 500,000 x 64 table)"),
    Patch("sparse_updates_merged_under_replicas", FIX,
          {Target("TFOptimizer", name): _rows_merged_before_scatter
           for name in ("assign_add", "assign_sub")},
          upstream="none filed; tf.config.experimental.enable_op_determinism lists scatter "
                   "ops among the nondeterministic ones",
          why="the replicas apply the same sparse update differently (repeated indices summed "
              "in a thread-dependent order): an Embedding's copies drift apart and kdist's "
              "replica check stops the fit"),
    Patch("ps_chief_exits_after_a_lost_worker", FIX,
          {Target("ParameterServerStrategy", "__init__"): _leaves_without_remote_removal},
          upstream="none filed yet (TF 2.22.0rc0); see kdist/keras_seam/fixes.py",
          tf_versions=("2.22.0", versions.TF_RANGE[1]),
          why="a parameter-server chief hangs at exit after a worker died: each traced "
              "function's finalizer waits without a deadline to remove it from the dead worker"),
]

