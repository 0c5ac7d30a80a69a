"""Keras 3's file-writing callbacks under a multi-worker strategy: only the chief writes.

Keras 3 dropped tf-keras's multi-worker handling, so with MultiWorkerMirrored every worker writes the
user's path: `ModelCheckpoint("m.weights.h5")` and `BackupAndRestore` fail with HDF5's "unable to
lock file" or `FileExistsError` (and the other worker dies with "Collective ops is aborted"), a
`.keras` checkpoint is written twice with truncation, `TensorBoard` leaves one event file per
worker and `CSVLogger` one interleaved file (no upstream report found; keras-team/keras#20585
covers the rest of the MWMS path). The fix, on the stock classes so that the user's
`keras.callbacks.*` work unchanged:

- the chief (or worker 0) writes the user's paths;
- every other worker makes the same save (so any collective inside it still matches on all
  workers) into a private temporary directory, deleted right after;
- `BackupAndRestore` restores every worker from the chief's backup, and only the chief repairs or
  deletes it.

Which task is the chief comes from the model's strategy (the hook `cluster_of`: the spec kdist built
it for), never from TF_CONFIG: a model outside any multi-worker strategy is its own chief, and
nothing changes for it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile

from kdist.cluster.spec import ClusterSpec
from kdist.keras_seam import keras_internals
from kdist.keras_seam.hooks import connected
from kdist.keras_seam.registry import Target

BACKUP_PATHS = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
                "_prev_training_metadata_path")  # the last two: Keras >= 3.7


def cluster_of_model(model) -> ClusterSpec:
    """The cluster `model` trains on, from its strategy; a single process when it has none."""
    spec = connected().cluster_of(keras_internals.strategy_of(model))
    return spec if spec is not None else ClusterSpec({})


def is_chief(callback, model=None) -> bool:
    return cluster_of_model(model or callback.model).is_chief


def _worker_temp_dir(callback, suffix: str = "", model=None) -> str:
    spec = cluster_of_model(model or callback.model)
    return tempfile.mkdtemp(prefix=f"kdist-workertemp-{spec.task_type}-{spec.task_index}-{suffix}")


@contextlib.contextmanager
def private_paths(callback, root: str, attributes: tuple[str, ...]):
    """On a non-chief task, points `callback.<attributes>` (paths under `root`) into a fresh
    temporary directory for the duration of the block, then restores them and deletes the
    directory. On the chief it changes nothing. Yields the directory written to."""
    if is_chief(callback):
        yield root
        return
    temp = _worker_temp_dir(callback)
    saved = {name: getattr(callback, name) for name in attributes if hasattr(callback, name)}
    try:
        for name, path in saved.items():
            setattr(callback, name, os.path.join(temp, os.path.relpath(path, root)))
        yield temp
    finally:
        for name, path in saved.items():
            setattr(callback, name, path)
        shutil.rmtree(temp, ignore_errors=True)


def _checkpoint_save(original):
    @functools.wraps(original)
    def _save_model(self, *args, **kwargs):
        with private_paths(self, os.path.dirname(self.filepath) or ".", ("filepath",)) as written:
            original(self, *args, **kwargs)
            self.last_written_dir = written  # where this save went (a deleted temp dir off-chief)

    return _save_model


def _backup_save(original):
    @functools.wraps(original)
    def _save_model(self, *args, **kwargs):
        with private_paths(self, self.backup_dir, BACKUP_PATHS):
            original(self, *args, **kwargs)

    return _save_model


def _backup_restore(original):
    @functools.wraps(original)
    def on_train_begin(self, logs=None):
        if is_chief(self):
            return original(self, logs)
        keras_internals.read_backup(self, original, logs)  # repairing the backup is the chief's job

    return on_train_begin


def _chief_only(original):
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        if is_chief(self):
            return original(self, *args, **kwargs)

    return method


def _redirected(attribute: str, suffix: str):
    """Off the chief, runs the method with `attribute` (a path) inside a private temp directory
    that `_cleaned_up` deletes at the end of training."""
    def wrap(original):
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            model = args[0] if original.__name__ == "set_model" else None  # not yet self.model
            if is_chief(self, model):
                return original(self, *args, **kwargs)
            user_path = getattr(self, attribute)
            if not getattr(self, "_kdist_temp_dir", None):  # one per training, reused by evaluate
                self._kdist_temp_dir = _worker_temp_dir(self, suffix, model)
            setattr(self, attribute, os.path.join(self._kdist_temp_dir,
                                                  os.path.basename(user_path) or "log"))
            try:
                return original(self, *args, **kwargs)
            finally:
                setattr(self, attribute, user_path)

        return method

    return wrap


def _cleaned_up(original):
    @functools.wraps(original)
    def on_train_end(self, logs=None):
        original(self, logs)
        temp = self.__dict__.pop("_kdist_temp_dir", None)
        if temp:
            shutil.rmtree(temp, ignore_errors=True)

    return on_train_end


FILE_CALLBACKS = {
    Target("ModelCheckpoint", "_save_model"): _checkpoint_save,
    Target("BackupAndRestore", "_save_model"): _backup_save,
    Target("BackupAndRestore", "on_train_begin"): _backup_restore,
    Target("BackupAndRestore", "on_train_end"): _chief_only,
    Target("TensorBoard", "set_model"): _redirected("log_dir", "tb-"),
    Target("TensorBoard", "on_train_end"): _cleaned_up,
    Target("CSVLogger", "on_train_begin"): _redirected("filename", "csv-"),
    Target("CSVLogger", "on_train_end"): _cleaned_up,
}
