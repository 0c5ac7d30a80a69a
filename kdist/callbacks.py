"""Multi-worker-safe callbacks: Keras's own, fixed, and a `BackupAndRestore` that does more.

Keras 3's file-writing callbacks write from every worker to the same path. kdist fixes the stock
classes themselves (`kdist.keras_compat.callbacks`), so the user's `keras.callbacks.ModelCheckpoint`,
`TensorBoard`, `CSVLogger` and `BackupAndRestore` work unchanged under a multi-worker strategy:
the chief writes the user's path, the other workers save into a private temporary directory that is
deleted right after. `kdist.callbacks.ModelCheckpoint` and `TensorBoard` are those same classes.
`kdist.callbacks.BackupAndRestore` adds step-level resume and checkpoint-on-preemption; once kdist
is active (`kdist.scope()`), `keras.callbacks.BackupAndRestore(...)` builds it too.

>>> import kdist, keras
>>> kdist.callbacks.ModelCheckpoint is keras.callbacks.ModelCheckpoint
True
>>> callbacks = [kdist.callbacks.ModelCheckpoint("ckpt/model.keras"),
...              kdist.callbacks.BackupAndRestore("backup"),
...              kdist.callbacks.TensorBoard("logs")]
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import keras

from kdist import elastic, exit_codes, keras_compat
from kdist.barriers import barrier
from kdist.keras_compat import internals, registry
from kdist.keras_compat.callbacks import BACKUP_PATHS, cluster_of_model, private_paths
from kdist.preemption import PreemptionNotice

keras_compat.install()  # the stock callbacks' multi-worker fix (it acts only under such strategies)

EXIT_PREEMPTED = exit_codes.PREEMPTED
ModelCheckpoint = keras.callbacks.ModelCheckpoint
TensorBoard = keras.callbacks.TensorBoard


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
    - Elastic: the position is saved in examples, with the global batch, replicas and workers, so
      a backup resumes on another number of workers: the epoch goes on after the same example,
      and one line says which batch policy the script applied (`kdist.elastic`). Per-replica
      compression state (PowerSGD and TopK residuals, TopK momentum) is saved as its mean over the
      replicas and every new replica starts from it: the mean, which is what enters the averaged
      gradient, is unchanged. PowerSGD's Q is the same on every replica and carries over as is.
    - Files are written under temporary names and renamed, so a task killed mid-save leaves the
      previous backup intact (`backup_dir` is a local or mounted filesystem: the rename is POSIX).
    - ``save_before_preemption=True``: on SIGTERM (a Kubernetes eviction, `kdist launch` stopping
      the job), every worker agrees at the next step boundary, the backup is saved and `fit` raises
      `Preempted`, exiting the process with code 75. Under MultiWorkerMirrored the notice and the
      step to save at go through TF's coordination service (`kdist.preemption`): a step pays one
      integer comparison, and the save comes at most 2 steps after the signal.

    >>> import kdist
    >>> backup = kdist.callbacks.BackupAndRestore("backup", save_freq=50,
    ...                                           save_before_preemption=True)
    """

    _PATHS = BACKUP_PATHS

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True, save_before_preemption=False):
        has_double_checkpoint = internals.for_running_keras(internals.BACKUP_HAS_DOUBLE_CHECKPOINT)
        if double_checkpoint and not has_double_checkpoint:
            raise ValueError(f"double_checkpoint=True needs Keras >= 3.7 (this is Keras "
                             f"{keras.__version__}): upgrade Keras or drop double_checkpoint")
        super().__init__(backup_dir, save_freq=save_freq, delete_checkpoint=delete_checkpoint,
                         **({"double_checkpoint": True} if double_checkpoint else {}))
        self.double_checkpoint = double_checkpoint
        if isinstance(save_freq, bool) or (isinstance(save_freq, int) and save_freq < 1):
            raise ValueError(f"save_freq={save_freq!r}: use 'epoch' or a positive number of steps")
        self.save_before_preemption = save_before_preemption
        self._epoch = self._step = 0
        self._last_saved = None
        self._resume_at = (0, 0)
        self._sigterm = None
        self._shape = elastic.Shape(None, 1, 1)

    # ------------------------------------------------------------------ restore
    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)  # weights and the epoch (Keras)
        x, y, sample_weight, batch_size = getattr(self.model, "_kdist_fit_input", None) or \
            (None,) * 4  # set by kdist's fit (kdist.fit_dispatch)
        self._shape = elastic.Shape(elastic.global_batch_of(x, batch_size),
                                    self.model.distribute_strategy.num_replicas_in_sync,
                                    cluster_of_model(self.model).num_workers)
        splittable = self.model.steps_per_execution == 1 and elastic.readable_by_position(
            x, y, sample_weight, self._shape.global_batch)
        plan = self._resume_plan(self._saved_metadata(), splittable)
        self._resume_at = (self.model._initial_epoch or 0, plan.step)
        if plan.step or plan.partial:
            _skip_steps(self.model, plan.step, self._partial_batch(plan, x, y, sample_weight))
        if self.save_before_preemption:
            self._sigterm = PreemptionNotice(cluster_of_model(self.model))

    def _saved_metadata(self) -> dict:
        if not os.path.exists(self._training_metadata_path):
            return {}
        with open(self._training_metadata_path, encoding="utf-8") as f:
            return json.load(f)

    def _resume_plan(self, saved: dict, splittable: bool) -> elastic.ResumePlan:
        plan = elastic.resume_plan(saved, self._shape, can_split_a_batch=splittable)
        if plan.message and cluster_of_model(self.model).is_chief:
            print(plan.message, file=sys.stderr, flush=True)
        return plan

    def _partial_batch(self, plan: elastic.ResumePlan, x, y, sample_weight):
        """The unseen examples of the batch holding the saved position, distributed as Keras
        distributes its batches; None when the position ends a batch."""
        if plan.partial is None:
            return None
        dataset = elastic.examples_between(x, y, sample_weight, *plan.partial)
        return self.model.distribute_strategy.experimental_distribute_dataset(dataset)

    # ------------------------------------------------------------------ save
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._step = batch + 1
        preempted = self._sigterm is not None and self._sigterm.step_done()
        if (self._epoch, self._step) <= self._resume_at:  # a skipped step: already in the backup
            self._last_batch_seen, self._batches_seen_since_last_saving = batch, 0
            return
        super().on_train_batch_end(batch, logs)  # saves every save_freq steps
        if preempted:
            self._save_and_exit()

    def _save_and_exit(self):
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
        _finish_scheduled_steps(self.model)
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
            examples = None if self._shape.global_batch is None \
                else self._step * self._shape.global_batch
            json.dump({"epoch": self._epoch, "step": self._step, "examples": examples,
                       **self._shape.as_metadata()}, f)
        os.replace(incoming, self._training_metadata_path)

    def on_train_end(self, logs=None):
        if self._sigterm is not None and self._sigterm.pending:  # too late: fit has finished
            print("kdist: SIGTERM arrived in the last steps of fit; training completed, the "
                  "program goes on", file=sys.stderr, flush=True)
        self._close_sigterm()
        super().on_train_end(logs)  # Keras's, made chief-only by kdist.keras_compat.callbacks
        # Every worker returns from fit once the chief has deleted the backup: a next fit with
        # the same backup_dir cannot restore the backup the chief is deleting.
        barrier(self.model.distribute_strategy)

    def _close_sigterm(self):
        if self._sigterm is not None:
            self._sigterm.close()
            self._sigterm = None


def _finish_scheduled_steps(model) -> None:
    """Under ParameterServer the chief's loop schedules steps ahead of the workers: wait until
    every scheduled step is applied, so the backup holds each step it counts."""
    from kdist.strategies import is_parameter_server

    if is_parameter_server(model.distribute_strategy):
        from kdist.ps import training

        training.join_scheduled(model.distribute_strategy)


def _skip_steps(model, steps: int, partial=None) -> None:
    """Makes the next `steps` training steps of `model.fit` read their batches without training.
    With `partial` (a distributed dataset of one batch), the step after them reads its batch and
    trains on `partial` instead: the rest of the batch that holds the saved position.

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
            if partial is None:
                return train(iterator)
            next(iterator)  # the batch holding the saved position, whose rest `partial` holds
            return train(iter(partial))
        for _ in range(per_call):
            next(iterator)
        model._kdist_initial_step -= per_call
        return {}

    skip_then_train._kdist_wrapped = train
    model.train_function = skip_then_train


def _as_kdist_backup(original):
    """`keras.callbacks.BackupAndRestore(...)` becomes a `kdist.callbacks.BackupAndRestore`."""
    def __init__(self, *args, **kwargs):
        if type(self) is keras.callbacks.BackupAndRestore:
            self.__class__ = BackupAndRestore  # a subclass: isinstance checks still hold
            return BackupAndRestore.__init__(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    return __init__


_installed: list = []


def install() -> None:
    """Gives the stock `keras.callbacks.BackupAndRestore` kdist's behaviour (step-level resume,
    and checkpoint-on-SIGTERM with ``save_before_preemption=True``): constructing it returns this
    module's subclass, so `isinstance` checks and the user's code are unchanged."""
    if not _installed:
        _installed.append(registry.replace(keras.callbacks.BackupAndRestore, "__init__",
                                           _as_kdist_backup))


def uninstall() -> None:
    registry.undo(_installed)
    _installed.clear()
