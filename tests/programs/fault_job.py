"""A training task for the fault-tolerance tests: `fault_job.py OUT_DIR [options]`.

Trains an MLP on the UCI digits (no shuffling, so resumed runs can be compared exactly) under
kdist.scope() with the stock `keras.callbacks.BackupAndRestore(save_freq=--save-freq,
save_before_preemption=True)`. Every trained step is appended to OUT_DIR/steps-<task>.jsonl as
{"restart", "epoch", "step", "time"}; skipped steps (already in the backup) are not. At the end each
task writes OUT_DIR/result-<task>.json (test accuracy, weight checksum, restart count).

--fault TASK:RESTART:EPOCH:STEP:SIGNAL makes that task send SIGNAL (KILL, STOP or TERM) to itself
after that step on that restart (RESTART `*`: on every start); the time is written to
OUT_DIR/fault-<task>.json first.

Elastic runs: --global-batch keeps the global batch whatever the world size (default: 32 per
replica, `kdist.global_batch_size(32)`); --compression NAME trains under kdist.scope(compression=);
--count-examples trains with each example's id next to its label and an `ExampleCounts` metric
(how many times each training example was in a trained batch this epoch, summed over replicas),
which the chief saves after every step to OUT_DIR/counts-<tag>-<restart>-<epoch>.npy (--tag names
the launch: restarted by hand, every launch starts at restart 0).
"""

import argparse
import json
import os
import signal
import sys
import time

import kdist

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--save-freq", type=int, default=5)
parser.add_argument("--fault", default=None)
parser.add_argument("--dead-peer-timeout", type=float, default=60.0)
parser.add_argument("--global-batch", type=int, default=None)
parser.add_argument("--compression", default=None)
parser.add_argument("--count-examples", action="store_true")
parser.add_argument("--tag", default="run")
parser.add_argument("--shuffle", action="store_true", help="fit's default input: shuffled arrays")
parser.add_argument("--cpu-devices", type=int, default=0, help="one process: Mirrored over N CPUs")
args = parser.parse_args()

spec = kdist.cluster()
task = spec.task or "local"
restart = int(os.environ.get("KDIST_RESTART_COUNT", "0"))
options = {"dead_peer_timeout": args.dead_peer_timeout} if spec.num_workers > 1 and not spec.has_ps \
    else {}
if args.cpu_devices:
    options = {"strategy": "mirrored", "devices": kdist.split_cpu(args.cpu_devices)}
strategy = kdist.strategy(**options)  # ps/worker tasks of a PS cluster serve here and exit
with open(os.path.join(args.out_dir, f"pid-{task}"), "w") as f:
    f.write(str(os.getpid()))

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import mnist_data  # noqa: E402

digits = mnist_data.load("digits")
x, x_test = digits.x_train.reshape(-1, 64), digits.x_test.reshape(-1, 64)
batch = args.global_batch or kdist.global_batch_size(32)
steps_per_epoch = -(-len(x) // batch)


class StepLog(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.log = open(os.path.join(args.out_dir, f"steps-{task}.jsonl"), "a")

    def on_train_begin(self, logs=None):  # after the backup's: the restored optimizer step
        self.start_iterations = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if logs == {} and not spec.has_ps:  # a skipped step (kdist returns no logs for it)
            return
        self.log.write(json.dumps({"restart": restart, "epoch": self.epoch, "step": batch + 1,
                                   "time": time.time()}) + "\n")
        self.log.flush()
        if args.fault:
            who, when, epoch, step, name = args.fault.rsplit(":", 4)
            when = restart if when == "*" else int(when)
            if (who, when, int(epoch), int(step)) == (task, restart, self.epoch, batch + 1):
                with open(os.path.join(args.out_dir, f"fault-{task}.json"), "w") as f:
                    json.dump({"signal": name, "time": time.time()}, f)
                os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
                if name == "STOP":
                    time.sleep(3600)


class ExampleCounts(keras.metrics.Metric):
    """Times each training example (its id is the label's second column) was trained on."""

    def __init__(self, name="examples"):
        super().__init__(name=name)
        self.counts = self.add_variable(shape=(len(x),), initializer="zeros", name="counts",
                                        aggregation="sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        ids = keras.ops.cast(y_true[:, 1], "int32")
        self.counts.assign_add(keras.ops.sum(keras.ops.one_hot(ids, len(x)), axis=0))

    def result(self):
        return keras.ops.sum(self.counts)


class SaveCounts(keras.callbacks.Callback):
    """Before the backup in the list: the counts of every trained step reach the file."""

    def __init__(self, metric):
        super().__init__()
        self.metric, self.epoch = metric, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        counts = keras.ops.convert_to_numpy(self.metric.counts.value)  # every worker reads
        if logs != {} and spec.is_chief:
            np.save(os.path.join(args.out_dir, f"counts-{args.tag}-{restart}-{self.epoch}.npy"), counts)


def label_column(loss_or_metric):
    return lambda y_true, y_pred: loss_or_metric(y_true[:, 0], y_pred)


keras.utils.set_random_seed(0)
scope_options = dict(options, **({"compression": kdist.compression.from_name(args.compression)}
                                 if args.compression else {}))
y = digits.y_train
callbacks = []
with kdist.scope(**scope_options):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if args.count_examples:
        counter = ExampleCounts()
        y = np.stack([digits.y_train, np.arange(len(x))], axis=1)
        callbacks.append(SaveCounts(counter))
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), label_column(loss),
                      metrics=[counter])
    else:
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), loss, metrics=["accuracy"])
# The stock class, as users write it: kdist's step-level resume and SIGTERM checkpoint apply.
backup = keras.callbacks.BackupAndRestore(os.path.join(args.out_dir, "backup"),
                                          save_freq=args.save_freq, save_before_preemption=True)
fit_args = {"steps_per_epoch": steps_per_epoch} if spec.has_ps else {"shuffle": args.shuffle}
step_log = StepLog()
model.fit(x, y, batch_size=batch, epochs=args.epochs, verbose=0,
          callbacks=[*callbacks, backup, step_log], **fit_args)
if args.count_examples:  # the labels carry ids: the accuracy from the predictions
    predicted = model.predict(x_test, batch_size=batch, verbose=0).argmax(axis=1)
    accuracy = float(np.mean(predicted == digits.y_test))
else:
    _, accuracy = model.evaluate(x_test, digits.y_test, batch_size=batch, verbose=0)
weights = np.concatenate([w.ravel() for w in model.get_weights()])
with open(os.path.join(args.out_dir, f"result-{task}.json"), "w") as f:
    json.dump({"accuracy": float(accuracy), "checksum": float(np.abs(weights).sum()),
               "restart": restart, "steps_per_epoch": steps_per_epoch,
               "start_iterations": step_log.start_iterations}, f)
np.save(os.path.join(args.out_dir, f"weights-{task}.npy"), weights)
