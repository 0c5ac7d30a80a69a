"""Every private Keras attribute kdist reads or sets, as a named function, in one place.

Features call these (and the hooks of `kdist.keras_seam.hooks`) instead of reaching into Keras.
Where an attribute changed between supported releases, the function holds one variant per
inclusive Keras range (`versions.for_running_keras`).

kdist keeps its own state of a Keras object (a model's training options, an optimizer's gradient
exchange) beside the object, in `attach`/`attached`, never in an attribute of it.

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> attach(model, "kdist's state"); attached(model)
"kdist's state"
"""

from __future__ import annotations

import contextlib
import inspect
import weakref

from kdist.keras_seam import versions

# ------------------------------------------------------------------ kdist's state of an object
_state: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def attach(owner, value) -> None:
    """Keeps `value` as kdist's state of `owner` (a model or an optimizer) while it lives."""
    _state[owner] = value


def attached(owner, default=None):
    """kdist's state of `owner`, or `default`."""
    try:
        return _state.get(owner, default)
    except TypeError:  # an object that cannot be weakly referenced has none
        return default


# ------------------------------------------------------------------ models
def strategy_of(model):
    """The strategy `model` was created under (None: outside any strategy scope); Keras's public
    `distribute_strategy` falls back to the current one instead."""
    return getattr(model, "_distribute_strategy", None)


def all_layers(model) -> list:
    """Every layer inside `model`, nested models' and custom layers' own layers included."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def optimizer_strategy(optimizer):
    """The strategy a TensorFlow-backend optimizer was created under (None: no optimizer)."""
    return getattr(optimizer, "_distribution_strategy", None)


def initial_epoch(model) -> int | None:
    """The epoch a restored backup told `fit` to start at (Keras's `BackupAndRestore` sets it)."""
    return model._initial_epoch


def set_initial_epoch(model, epoch: int) -> None:
    """Makes the running `fit` start at `epoch` (what Keras's `BackupAndRestore` does)."""
    model._initial_epoch = epoch


def compilation(model) -> tuple[int, int]:
    """Identifies `model`'s current compilation (a recompile gives a new one)."""
    return id(model.optimizer), id(model._compile_loss)


def build_from_spec(model, element_spec) -> None:
    """Builds the model, its metrics and its loss from the spec of one batch of data."""
    model._symbolic_build(data_batch=element_spec)


def flatten_metrics(model, logs: dict):
    """`evaluate`'s return value without `return_dict`: the metrics in Keras's order."""
    return model._flatten_metrics_in_order(logs)


def should_validate(model, epoch: int, validation_freq) -> bool:
    """Whether `fit` validates after `epoch` for this `validation_freq`."""
    return model._should_eval(epoch, validation_freq)


def set_train_function(model, function) -> None:
    """Makes `fit` call `function(iterator)` for its next executions (Keras's loop reads
    `model.train_function` before every execution)."""
    model.train_function = function


def wrap_train_step(model, make) -> None:
    """Replaces `model.train_step` (Keras's, or the user's override, or another kdist wrapper)
    by `make(train_step)`, once per `make` and model, on this model only."""
    wrap_method(model, "train_step", make)


def wrap_method(model, name: str, make) -> None:
    """Replaces the method `name` of `model` (`train_step`, `test_step`, `compute_loss`, ...:
    Keras's, the user's override or another kdist wrapper) by `make(method)`, once per `make` and
    model, on this model only."""
    method = getattr(model, name)
    applied = getattr(method, "_kdist_wrappers", ())
    if make not in applied:
        wrapped = make(method)
        wrapped._kdist_wrappers = (*applied, make)
        object.__setattr__(model, name, wrapped)  # not tracked by Keras


def model_of(method):
    """The model a method `wrap_method` handed to a `make` is bound to, under kdist's wrappers."""
    return inspect.unwrap(method).__self__


# ------------------------------------------------------------------ optimizers
def gradients_applied(optimizer) -> int:
    """How many times `optimizer` was given gradients: its steps, counting each step of
    Keras's gradient accumulation (its public `iterations` counts applied updates then)."""
    return int(optimizer._iterations.numpy())


def gradient_accumulators(optimizer) -> list:
    """The per-replica sums of Keras's `gradient_accumulation_steps` (none without it)."""
    return list(getattr(optimizer, "_accumulated_gradients", None) or [])


def var_key(optimizer, variable):
    """The key Keras's optimizer files a variable's slots under."""
    return optimizer._var_key(variable)


def add_optimizer_variable(optimizer, shape, initializer, dtype, name: str):
    """A non-trainable variable of `optimizer`, saved and restored with it (in its checkpoints),
    created as Keras creates its slots."""
    import keras

    with keras.name_scope(optimizer.name, caller=optimizer):
        variable = keras.Variable(initializer=keras.initializers.get(initializer), shape=shape,
                                  dtype=dtype, trainable=False, aggregation="mean", name=name)
    optimizer._track_variable(variable)
    return variable


@contextlib.contextmanager
def per_replica_variables(aggregation: str):
    """Variables created in this block are per replica (synchronised on read, combined by
    `aggregation`: "sum" or "mean") under tf.distribute, whatever the Keras release.

    Keras adds `synchronization=` to its TensorFlow `Variable` in 3.10, and Keras 3.5 drops
    `aggregation` before it reaches `tf.Variable`; a variable creator scope sets both on the
    `tf.Variable` itself on every release.
    """
    import tensorflow as tf

    combine = {"sum": tf.VariableAggregation.SUM, "mean": tf.VariableAggregation.MEAN}[aggregation]

    def creator(next_creator, **kwargs):
        kwargs.update(synchronization=tf.VariableSynchronization.ON_READ, aggregation=combine)
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        yield


# ------------------------------------------------------------------ fit's epoch iterator
def distributed_dataset(epoch_iterator):
    """The distributed dataset a `TFEpochIterator` iterates."""
    return epoch_iterator._distributed_dataset


def replace_distributed_dataset(epoch_iterator, make) -> None:
    """Makes a `TFEpochIterator` iterate ``make(its adapter's tf.data dataset)`` from its next
    epoch on; the iterator kept across epochs (``_current_iterator``, set when `steps_per_epoch` is
    given) is dropped so the next epoch starts on the new dataset."""
    epoch_iterator._distributed_dataset = make(epoch_iterator.data_adapter.get_tf_dataset())
    epoch_iterator._current_iterator = None


# ------------------------------------------------------------------ callbacks
# `keras.callbacks.BackupAndRestore`: Keras 3.7 added `double_checkpoint` (a copy of the previous
# backup, restored when the latest is damaged) and split the restore into `_load_model()`.
BACKUP_HAS_DOUBLE_CHECKPOINT = {("3.0.0", "3.6.99"): False, ("3.7.0", versions.KERAS_RANGE[1]): True}


def read_backup(callback, on_train_begin, logs) -> None:
    """Restores a stock `BackupAndRestore`'s model from its backup without repairing the files
    (a non-chief task)."""
    if versions.for_running_keras(BACKUP_HAS_DOUBLE_CHECKPOINT):
        callback._load_model()  # on_train_begin would also repair a damaged backup
    else:
        on_train_begin(callback, logs)  # only reads


# `steps_per_execution > 1`: Keras <= 3.6 unrolls the steps of an execution in one tf.function, so
# an epoch whose steps it does not divide ends inside that function, which miscounts steps on one
# device and aborts the all-reduce of the unfinished step with several replicas ("Collective ops
# is aborted by: CompleteGroup is cancelled"); Keras 3.7 runs them in a tf.while_loop.
STEPS_PER_EXECUTION_SAFE_WITH_REPLICAS = {("3.0.0", "3.6.99"): False,
                                          ("3.7.0", versions.KERAS_RANGE[1]): True}
