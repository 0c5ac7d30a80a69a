"""Multi-worker-safe callbacks: Keras's own, fixed, and a `BackupAndRestore` that does more.

Keras 3's file-writing callbacks write from every worker to the same path. kdist fixes the stock
classes themselves (`kdist.keras_seam.callbacks`), so the user's `keras.callbacks.ModelCheckpoint`,
`TensorBoard`, `CSVLogger` and `BackupAndRestore` work unchanged under a multi-worker strategy: the
chief writes the user's path, the other workers save into a private temporary directory that is
deleted right after. `kdist.callbacks.ModelCheckpoint` and `TensorBoard` are those same classes.
`kdist.callbacks.BackupAndRestore` adds verified backups (`kdist.fault_tolerance.backup`),
step-level and elastic resume and checkpoint-on-preemption; once kdist is imported,
`keras.callbacks.BackupAndRestore(...)` builds it too.

>>> import kdist, keras
>>> kdist.callbacks.ModelCheckpoint is keras.callbacks.ModelCheckpoint
True
>>> callbacks = [kdist.callbacks.ModelCheckpoint("ckpt/model.keras"),
...              kdist.callbacks.BackupAndRestore("backup"),
...              kdist.callbacks.TensorBoard("logs")]
"""

from __future__ import annotations

import os
import shutil
import sys

import keras

from kdist import exit_codes
from kdist import model_state as states
from kdist.barriers import barrier
from kdist.fault_tolerance import backup, elastic
from kdist.fault_tolerance.preemption import PreemptionNotice
from kdist.keras_seam import keras_internals, patches
from kdist.keras_seam.callbacks import cluster_of_model, is_chief, private_paths
from kdist.ps.coordinator import join_scheduled
from kdist.strategies import is_parameter_server
from kdist.validators import UsageError

patches.ensure()  # the stock callbacks' multi-worker fix (it acts only under such strategies)

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
    """`keras.callbacks.BackupAndRestore` with backups that cannot lie, multi-worker semantics,
    step-level and elastic resume, and checkpoint-on-preemption.

    - Every save is one atomic, self-describing unit (`kdist.fault_tolerance.backup`): a new
      generation of `backup_dir`, renamed into place once complete, with a manifest of its files'
      SHA-256, the model's architecture, the position and the world. A restore verifies all of it
      first; a damaged newest generation falls back to the previous one (the last two are kept, as
      Keras's ``double_checkpoint=True`` keeps them, whatever `double_checkpoint` says) with a
      warning naming both; anything else that cannot be restored as saved stops with
      `kdist.fault_tolerance.backup.BackupError`, naming the path, what is wrong and the fix.
    - The chief owns `backup_dir`; every worker restores from it (so all resume from one state);
      only the chief writes it, and deletes it at the end (`delete_checkpoint`).
    - With ``save_freq=N`` (steps), a restarted `fit` resumes at the saved epoch *and step*: the
      steps already trained in that epoch are skipped (their batches are read and dropped), so at
      most N steps are redone. Keras 3 itself restarts the whole epoch.
    - Elastic: the position is saved in examples, with the global batch, replicas and workers, so a
      backup resumes on another number of workers: the epoch goes on after the same example, and one
      line says which batch policy the script applied (`kdist.fault_tolerance.elastic`). Per-replica
      compression state (PowerSGD and TopK residuals, TopK momentum) is saved as its mean over the
      replicas and every new replica starts from it: the mean, which is what enters the averaged
      gradient, is unchanged. PowerSGD's Q is the same on every replica and carries over as is.
    - ``save_before_preemption=True``: on SIGTERM (a Kubernetes eviction, `kdist launch` stopping
      the job), every worker agrees at the next step boundary, the backup is saved and `fit` raises
      `Preempted`, exiting the process with code 75. Under MultiWorkerMirrored the notice and the
      step to save at go through TF's coordination service (`kdist.fault_tolerance.preemption`): a
      step pays one integer comparison, and the save comes at most 2 steps after the signal.

    `restored` is the `kdist.fault_tolerance.backup.Unit` the last `fit` resumed from (None: it
    started afresh).

    >>> import kdist
    >>> backup = kdist.callbacks.BackupAndRestore("backup", save_freq=50,
    ...                                           save_before_preemption=True)
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True, save_before_preemption=False):
        keras.callbacks.Callback.__init__(self)  # kdist's own format: none of Keras's files
        if not backup_dir:
            raise UsageError("backup_dir", f"{backup_dir!r} is empty",
                             "give a directory every worker can read (a mounted volume in a "
                             "cluster)")
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int)
                                     or save_freq < 1):
            raise UsageError("save_freq", f"{save_freq!r} is neither 'epoch' nor a number of steps",
                             "use 'epoch' or a positive number of steps")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        self.save_before_preemption = save_before_preemption
        self.restored = None
        self._epoch = self._step = 0
        self._last_step = self._since_save = 0  # steps_per_execution: several steps per batch end
        self._last_saved = None  # (epoch, step) of this fit's last save
        self._latest = None  # the generation it wrote (the chief's)
        self._resume_at = (0, 0)
        self._sigterm = None
        self._shape = elastic.Shape(None, 1, 1)

    # ------------------------------------------------------------------ restore
    def on_train_begin(self, logs=None):
        model = self.model
        x, y, sample_weight, batch_size = states.of(model).fit_input or (None,) * 4
        self._shape = elastic.Shape(elastic.global_batch_of(x, batch_size),
                                    model.distribute_strategy.num_replicas_in_sync,
                                    cluster_of_model(model).num_workers)
        self.restored = backup.latest(self.backup_dir, model)
        saved = {}
        if self.restored is not None:
            self.restored.restore(model)
            keras_internals.set_initial_epoch(model, self.restored.manifest["epoch"])
            saved = self.restored.metadata
        splittable = model.steps_per_execution == 1 and elastic.readable_by_position(
            x, y, sample_weight, self._shape.global_batch)
        plan = self._resume_plan(saved, splittable)
        self._resume_at = (keras_internals.initial_epoch(model) or 0, plan.step)
        if plan.step or plan.partial:
            _skip_steps(model, plan.step, self._partial_batch(plan, x, y, sample_weight))
        if self.save_before_preemption:
            self._sigterm = PreemptionNotice(cluster_of_model(model))

    def _resume_plan(self, saved: dict, splittable: bool) -> elastic.ResumePlan:
        plan = elastic.resume_plan(saved, self._shape, can_split_a_batch=splittable)
        if plan.message and is_chief(self):
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
        self._last_step = 0

    def on_train_batch_end(self, batch, logs=None):
        self._step = batch + 1
        preempted = self._sigterm is not None and self._sigterm.step_done()
        if (self._epoch, self._step) <= self._resume_at:  # a skipped step: already in the backup
            self._last_step, self._since_save = self._step, 0
            return
        self._since_save += self._step - self._last_step
        self._last_step = self._step
        if self.save_freq != "epoch" and self._since_save >= self.save_freq:
            self._save()
        if preempted:
            self._save_and_exit()

    def _save_and_exit(self):
        if self._last_saved != (self._epoch, self._step):
            self._save()
        message = (f"kdist: SIGTERM: saved the backup at epoch {self._epoch} step {self._step} "
                   f"in {self.backup_dir}; exiting with {EXIT_PREEMPTED} (restartable)")
        print(message, file=sys.stderr, flush=True)
        self._close_sigterm()
        raise Preempted(message)

    def on_epoch_end(self, epoch, logs=None):
        saved_at_last_step = self._last_saved == (epoch, self._step)
        self._epoch, self._step = epoch + 1, 0
        if self.save_freq == "epoch":
            self._save()
        elif saved_at_last_step and self._latest is not None:
            # The backup holds the whole epoch: resume at the next one.
            backup.update_position(self._latest, self._epoch, 0)

    def _save(self):
        _finish_scheduled_steps(self.model)
        metadata = {"epoch": self._epoch, "step": self._step,
                    "examples": None if self._shape.global_batch is None
                    else self._step * self._shape.global_batch, **self._shape.as_metadata()}
        # Every worker saves (any collective inside matches), off the chief into a private
        # directory deleted right after.
        with private_paths(self, self.backup_dir, ()) as directory:
            written = backup.write(directory, self.model, metadata)
        self._latest = written if is_chief(self) else None
        self._last_saved = (self._epoch, self._step)
        self._since_save = 0

    def on_train_end(self, logs=None):
        if self._sigterm is not None and self._sigterm.pending:  # too late: fit has finished
            print("kdist: SIGTERM arrived in the last steps of fit; training completed, the "
                  "program goes on", file=sys.stderr, flush=True)
        self._close_sigterm()
        if self.delete_checkpoint and is_chief(self):
            shutil.rmtree(self.backup_dir, ignore_errors=True)
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
    if is_parameter_server(model.distribute_strategy):
        join_scheduled(model.distribute_strategy)


def _skip_steps(model, steps: int, partial=None) -> None:
    """Makes the next `steps` training steps of `model.fit` read their batches without training.
    With `partial` (a distributed dataset of one batch), the step after them reads its batch and
    trains on `partial` instead: the rest of the batch that holds the saved position.

    Keras's fit loop calls `model.train_function(iterator)` once per `steps_per_execution` steps;
    kdist's parameter-server fit reads the model state's `initial_step` instead.
    """
    state = states.of(model)
    state.initial_step = steps
    train = model.train_function
    if train is None:  # parameter-server training: kdist's own fit loop skips
        return
    per_call = model.steps_per_execution

    def skip_then_train(iterator):
        if state.initial_step <= 0:
            keras_internals.set_train_function(model, train)
            if partial is None:
                return train(iterator)
            next(iterator)  # the batch holding the saved position, whose rest `partial` holds
            return train(iter(partial))
        for _ in range(per_call):
            next(iterator)
        state.initial_step -= per_call
        return {}

    keras_internals.set_train_function(model, skip_then_train)
