"""Keras internals that kdist relies on and that changed between the Keras releases it supports.

Each adapter declares, per inclusive Keras version range, the variant written for it; the running
Keras picks one (`for_running_keras`). A Keras outside every range raises an error naming the
supported range, never a crash deep inside `fit`.

>>> from kdist.keras_compat.internals import for_running_keras
>>> for_running_keras({("3.0.0", "3.15.99"): "every supported release"})
'every supported release'
"""

from __future__ import annotations

import contextlib
from typing import TypeVar

from kdist.keras_compat import registry

T = TypeVar("T")


def for_running_keras(variants: dict[tuple[str, str], T]) -> T:
    """The variant whose inclusive Keras version range holds the running Keras."""
    import keras

    for bounds, variant in variants.items():
        if registry.in_range(keras.__version__, bounds):
            return variant
    ranges = ", ".join(f"{low}..{high}" for low, high in variants)
    raise RuntimeError(f"kdist has no adapter for Keras {keras.__version__} (written for {ranges}); "
                       f"install a Keras in {registry.KERAS_RANGE[0]}..{registry.KERAS_RANGE[1]}")


# How `TFEpochIterator` hands out each execution's tf.data iterator (the last item of each tuple):
# Keras <= 3.6 through `enumerate_epoch()`, as (step, iterator); 3.7-3.10 by iterating it, as
# (step, iterator); 3.11+ by iterating it, as (first_step, last_step, iterator).
_EPOCH_ITERATION = {("3.0.0", "3.6.99"): lambda epoch: epoch.enumerate_epoch(),
                    ("3.7.0", registry.KERAS_RANGE[1]): iter}


def epoch_iterators(epoch_iterator):
    """Yields the tf.data iterator of each execution of a `TFEpochIterator`'s epoch."""
    for *_, iterator in for_running_keras(_EPOCH_ITERATION)(epoch_iterator):
        yield iterator


def distributed_dataset(epoch_iterator):
    """The distributed dataset a `TFEpochIterator` iterates (``_distributed_dataset`` on every
    supported Keras)."""
    return epoch_iterator._distributed_dataset


def replace_distributed_dataset(epoch_iterator, make) -> None:
    """Makes a `TFEpochIterator` iterate ``make(its adapter's tf.data dataset)`` from its next
    epoch on; the iterator kept across epochs (``_current_iterator``, set when `steps_per_epoch` is
    given) is dropped so the next epoch starts on the new dataset."""
    epoch_iterator._distributed_dataset = make(epoch_iterator.data_adapter.get_tf_dataset())
    epoch_iterator._current_iterator = None


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


# `keras.callbacks.BackupAndRestore`: Keras 3.7 added `double_checkpoint` (a copy of the previous
# backup, restored when the latest is damaged) and split the restore into `_load_model()`.
BACKUP_HAS_DOUBLE_CHECKPOINT = {("3.0.0", "3.6.99"): False, ("3.7.0", registry.KERAS_RANGE[1]): True}


def read_backup(callback, on_train_begin, logs) -> None:
    """Restores `callback.model` from its backup without repairing the files (a non-chief task)."""
    if for_running_keras(BACKUP_HAS_DOUBLE_CHECKPOINT):
        callback._load_model()  # on_train_begin would also repair a damaged backup
    else:
        on_train_begin(callback, logs)  # only reads


# `steps_per_execution > 1`: Keras <= 3.6 unrolls the steps of an execution in one tf.function, so
# an epoch whose steps it does not divide ends inside that function, which miscounts steps on one
# device and aborts the all-reduce of the unfinished step with several replicas ("Collective ops
# is aborted by: CompleteGroup is cancelled"); Keras 3.7 runs them in a tf.while_loop.
STEPS_PER_EXECUTION_SAFE_WITH_REPLICAS = {("3.0.0", "3.6.99"): False,
                                          ("3.7.0", registry.KERAS_RANGE[1]): True}
