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
import json
import os
import shutil
import signal
import sys
import tempfile

import keras

from kdist.cluster import cluster
from kdist.launcher import EXIT_PREEMPTED


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


class Preempted(SystemExit):
    """Raised out of `fit` after `BackupAndRestore(save_before_preemption=True)` saved on SIGTERM;
    the process exits with `EXIT_PREEMPTED` (75), which `kdist launch --max-restarts` and the
    rendered Kubernetes Jobs treat as "restart me"."""

    def __init__(self, message: str):
        super().__init__(EXIT_PREEMPTED)
        self.message = message


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` with multi-worker semantics, step-level resume and
    checkpoint-on-preemption.

    - The chief owns `backup_dir`; every worker restores from it (so all resume from one state);
      only the chief deletes it at the end.
    - With ``save_freq=N`` (steps), a restarted `fit` resumes at the saved epoch *and step*: the
      steps already trained in that epoch are skipped (their batches are read and dropped), so at
      most N steps are redone. Keras 3 itself restarts the whole epoch.
    - Files are written under temporary names and renamed, so a task killed mid-save leaves the
      previous backup intact (`backup_dir` is a local or mounted filesystem: the rename is POSIX).
    - ``save_before_preemption=True``: on SIGTERM (a Kubernetes eviction, `kdist launch` stopping
      the job), every worker agrees at the next step boundary, the backup is saved and `fit` raises
      `Preempted`, exiting the process with code 75. Under MultiWorkerMirrored the agreement is
      one scalar all-reduce per step.

    >>> import kdist
    >>> backup = kdist.callbacks.BackupAndRestore("backup", save_freq=50,
    ...                                           save_before_preemption=True)
    """

    _PATHS = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
              "_prev_training_metadata_path")

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True, save_before_preemption=False):
        super().__init__(backup_dir, save_freq, double_checkpoint, delete_checkpoint)
        if isinstance(save_freq, bool) or (isinstance(save_freq, int) and save_freq < 1):
            raise ValueError(f"save_freq={save_freq!r}: use 'epoch' or a positive number of steps")
        self.save_before_preemption = save_before_preemption
        self._epoch = self._step = 0
        self._last_saved = None
        self._resume_at = (0, 0)
        self._sigterm = None

    # ------------------------------------------------------------------ restore
    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)  # weights and the epoch (Keras)
        step = self._saved_step()
        self._resume_at = (self.model._initial_epoch or 0, step)
        if step:
            _skip_steps(self.model, step)
        if self.save_before_preemption:
            self._sigterm = _SigtermFlag()

    def _saved_step(self) -> int:
        if not os.path.exists(self._training_metadata_path):
            return 0
        with open(self._training_metadata_path, encoding="utf-8") as f:
            return int(json.load(f).get("step", 0))

    # ------------------------------------------------------------------ save
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._step = batch + 1
        if (self._epoch, self._step) <= self._resume_at:  # a skipped step: already in the backup
            self._last_batch_seen, self._batches_seen_since_last_saving = batch, 0
            return
        super().on_train_batch_end(batch, logs)  # saves every save_freq steps
        if self._sigterm is not None and self._sigterm.agreed(self.model.distribute_strategy):
            if self._last_saved != (self._epoch, self._step):
                self._save_model()
            message = (f"kdist: SIGTERM: saved the backup at epoch {self._epoch} step {self._step} "
                       f"in {self.backup_dir}; exiting with {EXIT_PREEMPTED} (restartable)")
            print(message, file=sys.stderr, flush=True)
            self._close_sigterm()
            raise Preempted(message)

    def on_epoch_end(self, epoch, logs=None):
        saved_at_last_step = self._last_saved == (epoch, self._step)
        self._epoch, self._step = epoch + 1, 0
        super().on_epoch_end(epoch, logs)  # saves when save_freq="epoch"
        if saved_at_last_step:  # the backup holds the whole epoch: resume at the next one
            with private_paths(self, self.backup_dir, self._PATHS):
                self._write_metadata()

    def _save_model(self):
        with private_paths(self, self.backup_dir, self._PATHS):
            os.makedirs(self.backup_dir, exist_ok=True)
            if self.double_checkpoint:
                for path in (self._weights_path, self._training_metadata_path):
                    if os.path.exists(path):
                        shutil.copyfile(path, f"{path}.bkp")
            incoming = os.path.join(self.backup_dir, "incoming.weights.h5")
            self.model.save_weights(incoming, overwrite=True)
            os.replace(incoming, self._weights_path)
            self._write_metadata()
        self._last_saved = (self._epoch, self._step)

    def _write_metadata(self):
        incoming = self._training_metadata_path + ".incoming"
        with open(incoming, "w", encoding="utf-8") as f:
            json.dump({"epoch": self._epoch, "step": self._step}, f)
        os.replace(incoming, self._training_metadata_path)

    def on_train_end(self, logs=None):
        self._close_sigterm()
        if cluster().is_chief:
            super().on_train_end(logs)

    def _close_sigterm(self):
        if self._sigterm is not None:
            self._sigterm.close()
            self._sigterm = None


def _skip_steps(model, steps: int) -> None:
    """Makes the next `steps` training steps of `model.fit` read their batches without training.

    Keras's fit loop calls `model.train_function(iterator)` once per `steps_per_execution` steps;
    kdist's parameter-server fit reads `model._kdist_initial_step` instead.
    """
    model._kdist_initial_step = steps
    train = getattr(model.train_function, "_kdist_wrapped", model.train_function)
    if train is None:  # parameter-server training: kdist's own fit loop skips
        return
    per_call = model.steps_per_execution

    def skip_then_train(iterator):
        if model._kdist_initial_step <= 0:
            model.train_function = train
            return train(iterator)
        for _ in range(per_call):
            next(iterator)
        model._kdist_initial_step -= per_call
        return {}

    skip_then_train._kdist_wrapped = train
    model.train_function = skip_then_train


class _SigtermFlag:
    """Records SIGTERM instead of dying; `agreed()` tells whether any worker received it."""

    def __init__(self):
        spec = cluster()
        self.received = False
        self._all_reduce = spec.num_workers > 1 and not spec.has_ps  # else one process runs fit
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self.received = True

    def agreed(self, strategy) -> bool:
        if not self._all_reduce:
            return self.received
        import tensorflow as tf

        local = tf.constant(1.0 if self.received else 0.0)
        total = strategy.reduce("SUM", strategy.run(lambda: local), axis=None)
        return float(total) > 0

    def close(self):
        signal.signal(signal.SIGTERM, self._previous)


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
