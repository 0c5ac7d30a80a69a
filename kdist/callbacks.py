"""Multi-worker-safe versions of the Keras callbacks that write files.

Keras 3's callbacks write from every worker to the same path. These subclasses keep the Keras
signatures and behaviour, and under a multi-worker cluster:

- the chief (or worker 0 when there is no chief) writes the user's path;
- every other worker performs the same save (so any collective inside it still matches on all
  workers) into a private temporary directory, which it deletes right after;
- `BackupAndRestore` restores every worker from the chief's backup, so all resume from one state
  (the backup directory must be on storage every worker can read, as with tf-keras).

>>> import kdist
>>> callbacks = [kdist.callbacks.ModelCheckpoint("ckpt/model.keras"),
...              kdist.callbacks.BackupAndRestore("backup"),
...              kdist.callbacks.TensorBoard("logs")]
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import keras

from kdist.cluster import cluster


@contextlib.contextmanager
def private_paths(owner, root: str, attributes: tuple[str, ...]):
    """On a non-chief task, points `owner.<attributes>` (paths under `root`) into a fresh temporary
    directory for the duration of the block, then restores them and deletes the directory.
    On the chief it changes nothing. Yields the directory written to."""
    spec = cluster()
    if spec.is_chief:
        yield root
        return
    temp = tempfile.mkdtemp(prefix=f"kdist-workertemp-{spec.task_type}-{spec.task_index}-")
    saved = {name: getattr(owner, name) for name in attributes}
    try:
        for name, path in saved.items():
            setattr(owner, name, os.path.join(temp, os.path.relpath(path, root)))
        yield temp
    finally:
        for name, path in saved.items():
            setattr(owner, name, path)
        shutil.rmtree(temp, ignore_errors=True)


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint` that only the chief writes to `filepath`.

    `last_written_dir` tells where the last save went (the user's directory on the chief, a deleted
    temporary directory elsewhere).
    """

    last_written_dir = None

    def _save_model(self, epoch, batch, logs):
        root = os.path.dirname(self.filepath) or "."
        with private_paths(self, root, ("filepath",)) as written:
            super()._save_model(epoch, batch, logs)
            self.last_written_dir = written


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` with tf-keras's multi-worker semantics: the chief owns
    `backup_dir`, every worker restores from it, only the chief deletes it at the end."""

    _PATHS = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
              "_prev_training_metadata_path")

    def _save_model(self):
        with private_paths(self, self.backup_dir, self._PATHS):
            super()._save_model()

    def on_train_end(self, logs=None):
        if cluster().is_chief:
            super().on_train_end(logs)


class TensorBoard(keras.callbacks.TensorBoard):
    """`keras.callbacks.TensorBoard` that writes `log_dir` from the chief only; other workers log to
    a temporary directory removed when training ends."""

    _temp_log_dir = None

    def set_model(self, model):
        spec = cluster()
        if spec.is_chief:
            return super().set_model(model)
        user_log_dir = self.log_dir
        self._temp_log_dir = tempfile.mkdtemp(
            prefix=f"kdist-workertemp-{spec.task_type}-{spec.task_index}-tb-")
        self.log_dir = self._temp_log_dir
        try:
            super().set_model(model)
        finally:
            self.log_dir = user_log_dir

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self._temp_log_dir:
            shutil.rmtree(self._temp_log_dir, ignore_errors=True)
            self._temp_log_dir = None
