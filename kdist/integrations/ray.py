"""Ray Train: kdist inside `ray.train.tensorflow.TensorflowTrainer`.

Ray starts the workers and writes each one's TF_CONFIG (every task a TF ``worker``, its index the
world rank), so ``kdist.scope()`` picks MultiWorkerMirrored there as under any launcher, and `fit`,
`evaluate`, kdist's callbacks and compression work unchanged. `ReportCheckpoint` adds what a Ray
user expects of a Keras job:

- every epoch's metrics go to ``ray.train.report`` (all workers call it, as Ray requires), with a
  checkpoint from the chief (rank 0) only: a `kdist.fault_tolerance.backup` unit (the model's
  weights, optimizer and compression state in ``model.weights.h5``, and a manifest with their
  SHA-256, the architecture and the next epoch). Every worker saves (the compression state is
  all-reduced as it is saved); the others' copies are deleted;
- at the start of `fit`, a restarted run (``FailureConfig(max_failures=...)``) resumes from
  ``ray.train.get_checkpoint()``, verified first (a damaged checkpoint or one of another model
  raises `kdist.fault_tolerance.backup.BackupError`): weights, optimizer and epoch.

For step-level resume add kdist's `BackupAndRestore` with a ``backup_dir`` every worker can read,
*after* `ReportCheckpoint` in the callbacks: it restores later in `on_train_begin`, so its backup,
saved every ``save_freq`` steps, overrides the epoch checkpoint when there is one. Install with
``pip install ".[ray]"``; this module imports Ray only when a `ReportCheckpoint` is made.

    import kdist
    from kdist.integrations.ray import ReportCheckpoint

    def train_loop_per_worker(config):
        with kdist.scope():
            model = build_model()
            model.compile(...)
        model.fit(x, y, batch_size=kdist.global_batch_size(64), epochs=5,
                  callbacks=[ReportCheckpoint(),
                             kdist.callbacks.BackupAndRestore(config["backup_dir"], save_freq=50)])

    TensorflowTrainer(train_loop_per_worker, scaling_config=ScalingConfig(num_workers=2),
                      run_config=RunConfig(failure_config=FailureConfig(max_failures=2))).fit()
"""

from __future__ import annotations

import tempfile

import keras

from kdist.fault_tolerance import backup
from kdist.keras_seam import keras_internals


class ReportCheckpoint(keras.callbacks.Callback):
    """Reports each epoch's logs to Ray Train, with a checkpoint from rank 0 every
    `checkpoint_every` epochs (0: never); resumes from Ray's latest checkpoint at train begin."""

    def __init__(self, checkpoint_every: int = 1):
        super().__init__()
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or \
                checkpoint_every < 0:
            raise ValueError(f"checkpoint_every={checkpoint_every!r}: use a number of epochs >= 1, "
                             "or 0 to report metrics only")
        import ray.train  # fails here, with Ray's own message, when Ray is not installed

        self._train = ray.train
        self.checkpoint_every = checkpoint_every
        self.resumed_from = None  # the checkpoint's path and epoch when this fit resumed from one

    def on_train_begin(self, logs=None):
        checkpoint = self._train.get_checkpoint()
        if checkpoint is None:
            return
        with checkpoint.as_directory() as folder:
            unit = backup.verify(folder, backup.architecture(self.model))  # or BackupError
            unit.restore(self.model)
            epoch = unit.manifest["epoch"]
        keras_internals.set_initial_epoch(self.model, epoch)  # fit starts its epoch loop there
        self.resumed_from = (checkpoint.path, epoch)
        print(f"kdist: resumed from Ray checkpoint {checkpoint.path} at epoch {epoch}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        metrics = {name: float(value) for name, value in (logs or {}).items()}
        metrics["epoch"] = epoch
        if not self.checkpoint_every or (epoch + 1) % self.checkpoint_every:
            self._train.report(metrics)
            return
        # Every worker saves: saving compression state all-reduces it, so a save on rank 0 alone
        # would wait forever for the others. Only rank 0's copy becomes the checkpoint.
        with tempfile.TemporaryDirectory() as folder:  # Ray copies it to storage in report()
            backup.write_unit(folder, self.model, {"epoch": epoch + 1, "step": 0})
            chief = self._train.get_context().get_world_rank() == 0
            self._train.report(metrics, checkpoint=self._train.Checkpoint.from_directory(folder)
                               if chief else None)
