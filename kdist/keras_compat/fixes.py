"""The upstream Keras 3 / TensorFlow bugs kdist fixes, each registered with its report and range.

>>> from kdist import keras_compat
>>> active = keras_compat.install()          # what kdist.scope() does
>>> "scalar_metric_reduce" in active
True
"""

from __future__ import annotations

import functools
import json
import zlib

from kdist.keras_compat import internals, registry
from kdist.keras_compat.callbacks import patch_file_callbacks
from kdist.strategies import cluster_of, is_multi_worker, is_parameter_server


# ----------------------------------------------------------------------------------------------
# 1. `_maybe_symbolic_build` all-reduces the first batch just to learn its shapes. Under MWMS the
#    cross-worker `strategy.reduce(MEAN, <nested PerReplica>, axis=None)` cannot convert the
#    PerReplica structure and raises "Attempt to convert a value (PerReplica...) with an unsupported
#    type" (flat inputs and dict inputs alike: keras-team/keras#20585, keras-team/keras#20329,
#    tensorflow/tensorflow#72388). Shapes need no collective: take the first local replica's batch.
def _patch_symbolic_build():
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    def make(original):
        @functools.wraps(original)
        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            if self._distribute_strategy is None or iterator is None:
                return original(self, iterator=iterator, data_batch=data_batch)
            strategy = self.distribute_strategy
            for it in internals.epoch_iterators(iterator):
                batch = next(it)
                data_batch = tree.map_structure(
                    lambda v: (strategy.experimental_local_results(v)[0]
                               if isinstance(v, tf.distribute.DistributedValues) else v), batch)
                break
            return original(self, iterator=None, data_batch=data_batch)

        return _maybe_symbolic_build

    return [registry.replace(trainer.TensorFlowTrainer, "_maybe_symbolic_build", make)]


# ----------------------------------------------------------------------------------------------
# 2. `reduce_per_replica(..., "mean")` reduces every step's logs with `strategy.reduce("MEAN", v,
#    axis=0)` under multi-worker collectives; the logs are scalars, so TF raises "Invalid reduction
#    dimension 0 for input with 0 dimensions" (keras-team/keras#20585). Scalars are all-reduced
#    with axis=None; tensors keep Keras's behaviour.
def _patch_scalar_reduce():
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    def make(original):
        @functools.wraps(original)
        def reduce_per_replica(values, strategy, reduction):
            if reduction not in ("auto", "mean") or not is_multi_worker(strategy):
                return original(values, strategy, reduction)

            def reduce(v):
                axis = None if v.shape.rank == 0 else 0
                return strategy.reduce("MEAN", v, axis=axis)

            return tree.map_structure(reduce, values)

        return reduce_per_replica

    return [registry.replace(trainer, "reduce_per_replica", make)]


# ----------------------------------------------------------------------------------------------
# 3. In-memory arrays (`fit(x=np_array, shuffle=True)`): Keras's ArrayDataAdapter permutes the
#    indices with an unseeded `tf.random.shuffle` in every process, then tf.data auto-shards the
#    batches by DATA. Each worker takes its slice of a *different* permutation, so within an epoch
#    some examples are trained on twice and others never. No upstream report found; tf-keras avoided
#    it by not shuffling per worker. kdist shuffles with one seed shared by every worker of the job
#    (derived from the addresses of the strategy's cluster) and reshuffles each epoch, so the shards
#    partition it.
def _shared_shuffle_seed(spec) -> int:
    return zlib.crc32(json.dumps(spec.jobs, sort_keys=True).encode())


def _consistently_shuffled_dataset(adapter, seed: int):
    import numpy as np
    import tensorflow as tf
    from keras.src import tree
    from keras.src.trainers.data_adapters import array_slicing

    inputs = tree.lists_to_tuples(
        array_slicing.convert_to_sliceable(adapter._inputs, target_backend="tensorflow"))
    if not all(isinstance(t, np.ndarray) or (tf.is_tensor(t) and not isinstance(
            t, (tf.SparseTensor, tf.RaggedTensor))) for t in tree.flatten(inputs)):
        raise ValueError("fit(shuffle=True) on in-memory sparse or ragged inputs under "
                         "MultiWorkerMirroredStrategy cannot be shuffled identically on every "
                         "worker; pass a tf.data.Dataset (shuffled with a fixed seed) or "
                         "shuffle=False")
    indices = tf.data.Dataset.range(adapter._num_samples)
    if adapter._shuffle == "batch":
        indices = indices.batch(adapter._batch_size).shuffle(
            adapter.num_batches, seed=seed, reshuffle_each_iteration=True)
    else:
        indices = indices.shuffle(adapter._num_samples, seed=seed,
                                  reshuffle_each_iteration=True).batch(adapter._batch_size)
    dataset = indices.map(lambda i: tree.map_structure(lambda t: tf.gather(t, i), inputs),
                          num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def _patch_array_shuffle():
    from keras.src.backend.tensorflow import trainer
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    def make(original):
        @functools.wraps(original)
        def __init__(self, distribute_strategy=None, *args, **kwargs):
            original(self, distribute_strategy, *args, **kwargs)
            adapter = self.data_adapter
            if (isinstance(adapter, ArrayDataAdapter) and adapter._shuffle
                    and is_multi_worker(distribute_strategy)):
                seed = _shared_shuffle_seed(cluster_of(distribute_strategy))
                self._distributed_dataset = distribute_strategy.experimental_distribute_dataset(
                    _consistently_shuffled_dataset(adapter, seed))

        return __init__

    return [registry.replace(trainer.TFEpochIterator, "__init__", make)]


# ----------------------------------------------------------------------------------------------
# 4. Keras 3's `Variable.assign_add/assign_sub` is `assign(self + value)`: a read-modify-write.
#    Under ParameterServerStrategy the workers update the same ps variables concurrently, so
#    increments are lost: metrics come out wrong (accuracy 1.12 measured) and
#    `optimizer.iterations` undercounts. No upstream report found. Under PSS, kdist uses the
#    variable's own assign_add/assign_sub, which the ps applies atomically.
def _patch_atomic_assign():
    import tensorflow as tf
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.tensorflow import core

    def make(name):
        def wrap(original):
            @functools.wraps(original)
            def method(self, value):
                if (self._value is None or in_stateless_scope()
                        or not is_parameter_server(tf.distribute.get_strategy())):
                    return original(self, value)
                value = self._convert_to_tensor(value, dtype=self.dtype)
                return getattr(self._value, name)(value)

            return method

        return wrap

    return [registry.replace(core.Variable, name, make(name)) for name in ("assign_add", "assign_sub")]



# ----------------------------------------------------------------------------------------------
# 5. `steps_per_execution > 1` under Mirrored and MultiWorkerMirrored: Keras runs each execution's
#    steps in a `tf.while_loop` whose body calls the distributed step inside a `tf.cond`; TF then
#    fails with "You must feed a value for placeholder tensor '...while/cond/Placeholder...'"
#    (keras-team/keras#19246; Keras <= 3.6 unrolled the steps in Python and has no such loop).
#    Under those strategies kdist keeps Keras's loop but takes the step
#    out of the cond: the loop's condition checks that a next batch exists, the body runs the step
#    on it and (a cond over the iterator only) fetches the one after while steps remain. The first
#    batch is read with `get_next()`: at the end of the data its OutOfRangeError ends the epoch,
#    as Keras's epoch iterator expects.
def _multi_step_function(trainer, step_function):
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer

    strategy = trainer.distribute_strategy

    def one_step(data):
        outputs = strategy.run(step_function, args=(data,))
        return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

    @tf.autograph.experimental.do_not_convert
    def steps(iterator):
        k = trainer.steps_per_execution
        outputs = one_step(iterator.get_next())

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


def _patch_steps_per_execution():
    from keras.src.backend.tensorflow import trainer

    def make(original):
        @functools.wraps(original)
        def _make_function(self, step_function):
            strategy = self.distribute_strategy
            if self.steps_per_execution == 1 or strategy.num_replicas_in_sync == 1 or \
                    is_parameter_server(strategy):
                return original(self, step_function)
            return _multi_step_function(self, step_function)

        return _make_function

    return [registry.replace(trainer.TensorFlowTrainer, "_make_function", make)]


# ----------------------------------------------------------------------------------------------
# 6. Keras < 3.8 does not scale the loss for distribution: each replica's gradient is that of its
#    mean loss, tf.distribute sums them across replicas, so every update is N times too large with
#    N replicas (keras-team/keras#19891, fixed in Keras 3.8 by keras-team/keras#20609). kdist
#    divides the loss by the replicas in sync where the stock train_step turns it into gradients,
#    `optimizer.scale_loss` (also LossScaleOptimizer's); the logged loss is unchanged.
def _patch_loss_scaling():
    import tensorflow as tf
    from keras.src.optimizers import base_optimizer, loss_scale_optimizer

    def make(original):
        @functools.wraps(original)
        def scale_loss(self, loss):
            loss = original(self, loss)
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            return loss if replicas == 1 else loss * (1.0 / replicas)

        return scale_loss

    return [registry.replace(owner, "scale_loss", make)
            for owner in (base_optimizer.BaseOptimizer, loss_scale_optimizer.LossScaleOptimizer)]


# ----------------------------------------------------------------------------------------------
# 7. Keras < 3.10 creates metric variables as ordinary (mirrored) variables: each worker keeps its
#    own counts, so two MWMS workers log different losses and `evaluate` reports one worker's
#    share of the data (keras-team/keras#21061; Keras 3.10 creates them synchronised on read,
#    keras-team/keras#21072).
#    kdist creates them per replica and combined on read, with the metric's own aggregation, also
#    when Keras defers creating the tf.Variable (compiled metrics are built in a stateless scope).
def _patch_metric_variables():
    from keras.src.backend.tensorflow import core
    from keras.src.metrics import metric

    def make_add_variable(original):
        @functools.wraps(original)
        def add_variable(self, shape, initializer, dtype=None, aggregation="sum", name=None):
            combine = aggregation if aggregation in ("sum", "mean") else "sum"
            with internals.per_replica_variables(combine):
                variable = original(self, shape, initializer, dtype=dtype,
                                    aggregation=aggregation, name=name)
            variable._kdist_on_read = combine  # for a deferred creation, below
            return variable

        return add_variable

    def make_initialize(original):
        @functools.wraps(original)
        def initialize(self, value_or_initializer):
            combine = getattr(self, "_kdist_on_read", None)
            if combine is None:
                return original(self, value_or_initializer)
            with internals.per_replica_variables(combine):
                return original(self, value_or_initializer)

        return initialize

    # Where the TF backend creates the tf.Variable: both methods in Keras <= 3.9.
    return [registry.replace(metric.Metric, "add_variable", make_add_variable)] + [
        registry.replace(core.Variable, name, make_initialize)
        for name in ("_initialize", "_initialize_with_initializer") if name in vars(core.Variable)]


WORKAROUNDS = [
    registry.Workaround("symbolic_build_without_collective",
                        "keras-team/keras#20585, keras-team/keras#20329, tensorflow/tensorflow#72388",
                        _patch_symbolic_build),
    registry.Workaround("scalar_metric_reduce", "keras-team/keras#20585", _patch_scalar_reduce),
    registry.Workaround("consistent_array_shuffle", "none filed; see kdist/keras_compat/fixes.py",
                        _patch_array_shuffle),
    registry.Workaround("atomic_assign_under_parameter_server", "none filed; see kdist/keras_compat/fixes.py",
                        _patch_atomic_assign),
    registry.Workaround("steps_per_execution_under_mirrored", "keras-team/keras#19246",
                        _patch_steps_per_execution, keras_versions=("3.7.0", registry.KERAS_RANGE[1])),
    registry.Workaround("loss_scaled_per_replica", "keras-team/keras#19891", _patch_loss_scaling,
                        keras_versions=("3.5.0", "3.7.99"), fixed_in="3.8.0"),
    registry.Workaround("metric_variables_synced_on_read", "keras-team/keras#21061",
                        _patch_metric_variables, keras_versions=("3.5.0", "3.9.99"),
                        fixed_in="3.10.0"),
    registry.Workaround("multi_worker_file_callbacks",
                        "none filed (tf-keras had it); see kdist/keras_compat/callbacks.py",
                        patch_file_callbacks),
]
