"""Keras 3 `fit` / `evaluate` / `predict` under ParameterServerStrategy (keras-team/keras#18624).

Written for Keras 3.15 on TensorFlow 2.21. `kdist.wiring.dispatch` routes a model's `fit` / `evaluate` /
`predict` here when its strategy is a ParameterServerStrategy. On the chief, `fit` becomes a
ClusterCoordinator loop:

- training data becomes a per-worker dataset, repeated: a `tf.data.Dataset`, a function
  `fn(input_context) -> Dataset`, or NumPy arrays (shuffled, batched by `batch_size`). TensorFlow
  traces the pipeline once on the chief and runs a copy on every worker. Its input context is
  always one pipeline (`num_input_pipelines=1`, TF 2.21 parameter_server_strategy_v2.py: "no
  synchronization beyond a worker"), so by default each worker reads the whole pipeline: shuffle
  without a fixed seed so that the workers' streams differ (NumPy input does). With
  `kdist.scope(ps_shard_input=True)` the context has one pipeline per worker and the worker's
  index as `input_pipeline_id` (a tensor: use it in dataset ops such as `shard`), and NumPy input
  is sharded the same way: each worker repeats its own disjoint part;
- `steps_per_epoch` is required: an epoch is that many steps scheduled on whichever worker is free,
  `steps_per_execution` steps per scheduled function;
- training is asynchronous SGD: each worker reads the current variables from the ps, computes a
  gradient and applies it to the ps without waiting for the others, so a gradient can be computed
  on variables that others have updated meanwhile (staleness); the ps apply updates atomically;
- metrics live on the ps, are reset at every epoch start and read after `coordinator.join()`, so
  the epoch logs count every step of the epoch once; batch-level callbacks see no logs;
- a worker that dies is replaced by the coordinator (its steps are rescheduled); a ps that dies
  fails `fit` with `ParameterServerFailure` (rerun: `BackupAndRestore` resumes);
- `evaluate` (and `fit`'s validation) shards the data over the workers, every example counted
  exactly once even when a worker fails (`kdist.ps.evaluation`), or runs on the chief with
  `kdist.scope(ps_evaluation="chief")`; `predict` runs on the chief, rows in input order.
"""

from __future__ import annotations

import numpy as np

from kdist import model_state as states
from kdist.keras_seam import keras_internals, tf_internals
from kdist.ps import evaluation, sync
from kdist.ps.coordinator import cached_function, coordinator, join_scheduled, num_workers
from kdist.strategies.registry import options_of


# ------------------------------------------------------------------------------------- fit
def fit(model, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
        validation_split=0.0, validation_data=None, shuffle=True, class_weight=None,
        sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None,
        validation_batch_size=None, validation_freq=1):
    import keras

    _reject_unsupported(validation_split=validation_split, class_weight=class_weight)
    if not steps_per_epoch:
        raise ValueError("fit(steps_per_epoch=...) is required under ParameterServerStrategy: the "
                         "workers read repeated datasets, so an epoch has no natural end. Pass the "
                         "number of steps per epoch (e.g. len(x_train) // batch_size)")
    strategy = model.distribute_strategy
    train_data = _training_dataset_fn(x, y, sample_weight, batch_size, shuffle)
    _build(model, strategy, train_data(None).element_spec)
    _reject_sharded_variables(model)
    iterator = iter(_per_worker_dataset(strategy, x, train_data))
    k = model.steps_per_execution
    schedule = [(_train_function(model, k), k)] * (steps_per_epoch // k) + \
        [(_train_function(model, 1), 1)] * (steps_per_epoch % k)

    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=verbose != 0, verbose=verbose, epochs=epochs,
            steps=steps_per_epoch, model=model)
    model.stop_training = False
    callbacks.on_train_begin()
    logs = {}
    state = states.of(model)
    sync_state = state.sync
    for epoch in range(keras_internals.initial_epoch(model) or initial_epoch, epochs):
        model.reset_metrics()
        if sync_state is not None:
            sync_state.reset_stats()
        callbacks.on_epoch_begin(epoch)
        step = 0
        skip, state.initial_step = state.initial_step, 0  # resumed mid-epoch (BackupAndRestore)
        for function, steps in schedule:
            if step + steps <= skip:
                step += steps
                continue
            callbacks.on_train_batch_begin(step)
            coordinator(strategy).schedule(function, args=(iterator,))
            step += steps
            callbacks.on_train_batch_end(step - 1, None)
        join_scheduled(strategy)
        logs = _metrics(model)
        if sync_state is not None:
            logs.update(sync_state.logs())
        if validation_data is not None and keras_internals.should_validate(model, epoch,
                                                                           validation_freq):
            val_x, val_y, val_w = _unpack(validation_data)
            val_logs = evaluate(model, val_x, val_y, batch_size=validation_batch_size or batch_size,
                                sample_weight=val_w, steps=validation_steps, callbacks=callbacks,
                                return_dict=True)
            logs.update({f"val_{name}": value for name, value in val_logs.items()})
        callbacks.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callbacks.on_train_end(logs)
    return model.history


def _train_function(model, steps: int):
    import tensorflow as tf

    def make():
        strategy = model.distribute_strategy
        sync_state = states.of(model).sync

        @tf.function
        def train(iterator):
            for _ in range(steps):
                if sync_state is None:  # asynchronous: the optimizer applies each gradient
                    logs = strategy.run(model.train_step, args=(next(iterator),))
                else:
                    logs = sync_state.step(iterator)  # kdist.ps.sync: the gradient goes to the ps
            return logs

        return train

    return cached_function(model, f"train_{steps}", make)


# ------------------------------------------------------------------------------------- evaluate
def evaluate(model, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
             steps=None, callbacks=None, return_dict=False, **kwargs):
    """Every example exactly once: sharded over the workers (`kdist.ps.evaluation`), or on the
    chief with `kdist.scope(ps_evaluation="chief")`."""
    import tensorflow as tf

    _reject_unsupported(**kwargs)
    dataset = _local_dataset(x, y, sample_weight, batch_size, steps)
    _build(model, model.distribute_strategy, dataset.element_spec)
    callbacks = _callback_list(model, callbacks, verbose, steps)
    callbacks.on_test_begin()
    model.reset_metrics()
    strategy = model.distribute_strategy
    if options_of(strategy).ps_evaluation == "workers":
        evaluation.run(model, dataset, callbacks, coordinator(strategy), num_workers(strategy))
    else:
        test_step = cached_function(model, "test", lambda: tf.function(model.test_step))
        _run_on_chief(dataset, test_step, callbacks.on_test_batch_begin,
                      lambda step, outputs: callbacks.on_test_batch_end(step, None))
    logs = _metrics(model)
    callbacks.on_test_end(logs)
    return logs if return_dict else keras_internals.flatten_metrics(model, logs)


def predict(model, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
    """Runs on the chief: rows come back in input order."""
    import keras
    import tensorflow as tf

    dataset = _local_dataset(x, None, None, batch_size, steps)
    callbacks = _callback_list(model, callbacks, verbose, steps)
    callbacks.on_predict_begin()
    predict_step = cached_function(model, "predict", lambda: tf.function(model.predict_step))
    outputs = _run_on_chief(dataset, predict_step, callbacks.on_predict_batch_begin,
                            lambda step, out: callbacks.on_predict_batch_end(step, {"outputs": out}))
    callbacks.on_predict_end()
    return keras.tree.map_structure(
        lambda *parts: np.concatenate([np.asarray(p) for p in parts]), *outputs)


def _run_on_chief(dataset, step_function, on_begin, on_end) -> list:
    """Runs `step_function` on every batch of `dataset` in this process, in order."""
    outputs = []
    for step, batch in enumerate(dataset):
        on_begin(step)
        outputs.append(step_function(batch))
        on_end(step, outputs[-1])
    return outputs


def _callback_list(model, callbacks, verbose, steps):
    import keras

    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return keras.callbacks.CallbackList(callbacks, add_progbar=verbose != 0, verbose=verbose,
                                         epochs=1, steps=steps, model=model)


# ------------------------------------------------------------------------------------- helpers
def _metrics(model) -> dict:
    return {name: float(value) for name, value in model.get_metrics_result().items()}


def _build(model, strategy, element_spec) -> None:
    """Creates every variable (model, metrics, optimizer) on the ps before any step is traced:
    steps that run on workers cannot create variables."""
    with strategy.scope():
        keras_internals.build_from_spec(model, element_spec)
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
    mode = sync.mode_of(model)
    state = states.of(model)
    if mode.kind != "async" and (state.sync is None
                                 or state.sync.model.optimizer is not model.optimizer):
        state.sync = sync.SyncState(model, mode, num_workers(strategy))


def _unpack(data):
    import keras

    if _is_dataset(data) or callable(data):
        return data, None, None
    return keras.utils.unpack_x_y_sample_weight(data)


def _per_worker_dataset(strategy, x, train_data):
    """The workers' copies of the training data.

    A `tf.data.Dataset` object built in the program goes to the workers as a dataset (TF serializes
    its graph and each worker runs a copy); a dataset built inside a function that captures it
    would not (its tensors live on the chief: "Unable to parse tensor proto").
    """
    shard = options_of(strategy).ps_shard_input
    if _is_dataset(x):
        if shard:
            raise ValueError(
                "ps_shard_input=True needs the training data as a dataset function "
                "fn(input_context) or NumPy arrays: a tf.data.Dataset object goes whole to every "
                "worker. Pass a function that builds the dataset, e.g. fit(lambda context: "
                "make_dataset().shard(context.num_input_pipelines, context.input_pipeline_id), "
                "...), or drop ps_shard_input")
        return coordinator(strategy).create_per_worker_dataset(
            strategy.experimental_distribute_dataset(x.repeat()))
    if shard:
        workers = num_workers(strategy)
        return coordinator(strategy).create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(
                lambda context: train_data(_worker_context(context, workers))))
    return coordinator(strategy).create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(train_data))


def _worker_context(context, workers: int):
    """TF's input context with one input pipeline per worker: the id is this worker's index (a
    tensor, known where the pipeline runs)."""
    import tensorflow as tf

    return tf.distribute.InputContext(
        num_input_pipelines=workers,
        input_pipeline_id=tf.distribute.coordinator.experimental_get_current_worker_index(),
        num_replicas_in_sync=context.num_replicas_in_sync)


def _is_dataset(x) -> bool:
    import tensorflow as tf

    return isinstance(x, tf.data.Dataset)


def _training_dataset_fn(x, y, sample_weight, batch_size, shuffle):
    """fn(input_context) -> repeated dataset for the workers (None: the chief's view, for shapes)."""
    import tensorflow as tf

    if _is_dataset(x) or callable(x):
        if y is not None or sample_weight is not None:
            raise ValueError("fit(x=<dataset or dataset function>) takes no y or sample_weight: "
                             "put them in the dataset's elements")
        if batch_size is not None:
            raise ValueError("fit(batch_size=...) is for NumPy inputs; batch the dataset instead")
        if _is_dataset(x):
            return lambda context: x.repeat()
        return lambda context: x(context or tf.distribute.InputContext()).repeat()
    arrays = _arrays(x, y, sample_weight)
    size = len(tf.nest.flatten(arrays)[0])

    def from_arrays(context):
        dataset = tf.data.Dataset.from_tensor_slices(arrays)
        if context is not None:  # one pipeline (TF's) unless ps_shard_input: then the worker's part
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        if shuffle:
            dataset = dataset.shuffle(size, reshuffle_each_iteration=True)
        return dataset.repeat().batch(batch_size or 32)

    return from_arrays


def _local_dataset(x, y, sample_weight, batch_size, steps):
    """The dataset (`steps` batches of it, or all), for evaluation or prediction on the chief."""
    import tensorflow as tf

    if callable(x) and not _is_dataset(x):
        x = x(tf.distribute.InputContext())
    if _is_dataset(x):
        if y is not None or sample_weight is not None:
            raise ValueError("evaluate(x=<dataset>) takes no y or sample_weight: put them in the "
                             "dataset's elements")
        dataset = x
    else:
        dataset = tf.data.Dataset.from_tensor_slices(_arrays(x, y, sample_weight)).batch(
            batch_size or 32)
    return dataset if steps is None else dataset.take(steps)


def _arrays(x, y, sample_weight):
    import keras

    if x is None:
        raise ValueError("no data: pass x (and y), a tf.data.Dataset or a dataset function")
    parts = tuple(part for part in (x, y, sample_weight) if part is not None)
    return keras.tree.lists_to_tuples(parts if len(parts) > 1 else (parts[0],))


def _reject_unsupported(**arguments) -> None:
    given = {name: value for name, value in arguments.items() if value not in (None, 0.0, {})}
    if given:
        name = next(iter(given))
        raise ValueError(f"{name}={given[name]!r} is not supported under ParameterServerStrategy "
                         "by kdist; remove it (for validation_split, pass validation_data)")


def _reject_sharded_variables(model) -> None:
    sharded = [v.path for v in model.trainable_variables
               if tf_internals.is_sharded_variable(v.value)]
    if sharded:
        raise ValueError(
            f"{sharded[0]} is a ShardedVariable (from variable_partitioner), which Keras 3's "
            "train_step cannot train ('ShardedVariable' object has no attribute 'handle'). Drop "
            "variable_partitioner and use kdist.layers.PartitionedDense / PartitionedEmbedding, "
            "whose shards are plain variables spread over the ps tasks")
