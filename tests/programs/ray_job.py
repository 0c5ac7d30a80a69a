"""kdist inside Ray Train: `ray_job.py OUT_DIR RAY_TEMP_DIR [--kill-at-step S]`.

Starts a local Ray cluster on loopback (this machine's CPUs, no dashboard) and runs two
`TensorflowTrainer` jobs of 2 workers on it, one after the other, in OUT_DIR/with_backup and
OUT_DIR/ray_only. Their loop is what a Ray user writes: ``kdist.scope()``, a Keras MLP on the UCI
digits (no shuffling), `fit` with `ReportCheckpoint` (and in with_backup PowerSGD rank 4 gradient
compression and kdist's `BackupAndRestore(save_freq=5)` after it), then `evaluate`. With
--kill-at-step S, rank 1 SIGKILLs itself KILL_DELAY seconds after step S of epoch 1 on the first
attempt; `FailureConfig(max_failures=1)` has Ray start the group again.

In each job's folder, each worker appends {"rank", "attempt", "epoch", "step", "iterations"} of
its first trained step per attempt (iterations: the optimizer's step count at train begin) to
first-steps.jsonl, and at the end writes weights-<rank>.npy and accuracy-<rank>. The driver prints
one JSON line: Ray's start-up seconds and, per job, its fit seconds, final metrics, and each kept
checkpoint's metrics and files.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time

# One node on loopback: Ray's laptop mode (the default binds this host's outside address).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# Ray starts its worker processes at nice 15 (its raylet's RAY_worker_niceness default; Ray's job
# manager sets 0 for submitted jobs). Beside another load at nice 0 they then get a few percent
# of a core and the test runs 20 times slower: run them at this process's priority, as a job would.
os.environ.setdefault("RAY_worker_niceness", "0")

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("ray_temp_dir")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--kill-at-step", type=int, default=None)
args = parser.parse_args()
# Ray's controller collects the workers' reports every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s): a
# worker that dies sooner after a report can take it along, and the restart resumes from the one
# before. The kill comes this long after step S, so epoch 0's checkpoint is Ray's latest.
KILL_DELAY = 5.0
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def train_loop_per_worker(config):
    import keras
    import numpy as np

    import kdist
    from kdist.integrations.ray import ReportCheckpoint
    import ray.train

    sys.path.insert(0, config["examples"])
    import mnist_data

    out, rank = config["out_dir"], ray.train.get_context().get_world_rank()
    attempt = len([f for f in os.listdir(out) if f.startswith(f"attempt-{rank}-")])
    open(os.path.join(out, f"attempt-{rank}-{attempt}"), "w").close()
    kdist.strategy()
    digits = mnist_data.load("digits")
    with kdist.scope(compression=config["compression"]):
        model = keras.Sequential([keras.Input(digits.x_train.shape[1:]), keras.layers.Flatten(),
                                  keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
        model.compile(keras.optimizers.Adam(2e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    class Steps(keras.callbacks.Callback):
        """Last in the list: sees the state the restoring callbacks left."""
        first = True

        def on_train_begin(self, logs=None):
            self.iterations = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

        def on_train_batch_end(self, step, logs=None):
            iterations = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            if iterations == self.iterations:  # a step the backup holds: its batch read, untrained
                return
            if self.first:
                self.first = False
                with open(os.path.join(out, "first-steps.jsonl"), "a") as f:
                    f.write(json.dumps({"rank": rank, "attempt": attempt, "epoch": self.epoch,
                                        "step": step, "iterations": self.iterations}) + "\n")
            if (config["kill_at_step"] is not None and rank == 1 and attempt == 0 and
                    self.epoch == 1 and step == config["kill_at_step"]):
                time.sleep(KILL_DELAY)
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

    callbacks = [ReportCheckpoint()]
    if config["backup"]:
        callbacks.append(kdist.callbacks.BackupAndRestore(os.path.join(out, "backup"), save_freq=5))
    model.fit(digits.x_train, digits.y_train, batch_size=kdist.global_batch_size(32),
              epochs=config["epochs"], shuffle=False, verbose=0, callbacks=[*callbacks, Steps()])
    _, accuracy = model.evaluate(digits.x_test, digits.y_test, batch_size=64, verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    np.save(os.path.join(out, f"weights-{rank}.npy"), weights)
    with open(os.path.join(out, f"accuracy-{rank}"), "w") as f:
        f.write(str(accuracy))


def run_job(name: str, backup: bool, compression: str | None) -> dict:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    out = os.path.join(args.out_dir, name)
    os.makedirs(out)
    trainer = TensorflowTrainer(
        train_loop_per_worker,
        train_loop_config={"out_dir": out, "examples": os.path.abspath(EXAMPLES), "backup": backup,
                           "compression": compression, "epochs": args.epochs,
                           "kill_at_step": args.kill_at_step},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=os.path.join(out, "ray"),
                             failure_config=FailureConfig(max_failures=1)))
    started = time.perf_counter()
    result = trainer.fit()
    seconds = time.perf_counter() - started
    checkpoints = []
    for checkpoint, metrics in result.best_checkpoints:
        with checkpoint.as_directory() as folder:
            checkpoints.append({"metrics": metrics, "files": sorted(os.listdir(folder)),
                                "path": checkpoint.path})
    return {"fit_seconds": seconds, "error": repr(result.error) if result.error else None,
            "metrics": result.metrics, "checkpoints": checkpoints}


def main():
    started = time.perf_counter()
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _temp_dir=args.ray_temp_dir,
             log_to_driver=False)
    ray_seconds = time.perf_counter() - started
    try:
        jobs = {"with_backup": run_job("with_backup", True, "powersgd:4"),
                "ray_only": run_job("ray_only", False, None)}
        print(json.dumps({"ray_init_seconds": ray_seconds, "jobs": jobs}))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
