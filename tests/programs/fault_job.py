"""A training task for the fault-tolerance tests: `fault_job.py OUT_DIR [options]`.

Trains an MLP on the UCI digits (no shuffling, so resumed runs can be compared exactly) under
kdist.scope() with the stock `keras.callbacks.BackupAndRestore(save_freq=--save-freq,
save_before_preemption=True)`. Every trained step is appended to OUT_DIR/steps-<task>.jsonl as
{"restart", "epoch", "step", "time"}; skipped steps (already in the backup) are not. At the end each
task writes OUT_DIR/result-<task>.json (test accuracy, weight checksum, restart count).

--fault TASK:RESTART:EPOCH:STEP:SIGNAL makes that task send SIGNAL (KILL, STOP or TERM) to itself
after that step on that restart; the time is written to OUT_DIR/fault-<task>.json first.
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
args = parser.parse_args()

spec = kdist.cluster()
task = spec.task or "local"
restart = int(os.environ.get("KDIST_RESTART_COUNT", "0"))
options = {"dead_peer_timeout": args.dead_peer_timeout} if spec.num_workers > 1 and not spec.has_ps \
    else {}
strategy = kdist.strategy(**options)  # ps/worker tasks of a PS cluster serve here and exit
with open(os.path.join(args.out_dir, f"pid-{task}"), "w") as f:
    f.write(str(os.getpid()))

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import mnist_data  # noqa: E402

digits = mnist_data.load("digits")
x, x_test = digits.x_train.reshape(-1, 64), digits.x_test.reshape(-1, 64)
batch = kdist.global_batch_size(32)
steps_per_epoch = -(-len(x) // batch)


class StepLog(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.log = open(os.path.join(args.out_dir, f"steps-{task}.jsonl"), "a")

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
            if (who, int(when), int(epoch), int(step)) == (task, restart, self.epoch, batch + 1):
                with open(os.path.join(args.out_dir, f"fault-{task}.json"), "w") as f:
                    json.dump({"signal": name, "time": time.time()}, f)
                os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
                if name == "STOP":
                    time.sleep(3600)


keras.utils.set_random_seed(0)
with kdist.scope(**options):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
# The stock class, as users write it: kdist's step-level resume and SIGTERM checkpoint apply.
backup = keras.callbacks.BackupAndRestore(os.path.join(args.out_dir, "backup"),
                                          save_freq=args.save_freq, save_before_preemption=True)
fit_args = {"steps_per_epoch": steps_per_epoch} if spec.has_ps else {"shuffle": False}
model.fit(x, digits.y_train, batch_size=batch, epochs=args.epochs, verbose=0,
          callbacks=[backup, StepLog()], **fit_args)
_, accuracy = model.evaluate(x_test, digits.y_test, batch_size=batch, verbose=0)
weights = np.concatenate([w.ravel() for w in model.get_weights()])
with open(os.path.join(args.out_dir, f"result-{task}.json"), "w") as f:
    json.dump({"accuracy": float(accuracy), "checksum": float(np.abs(weights).sum()),
               "restart": restart, "steps_per_epoch": steps_per_epoch}, f)
np.save(os.path.join(args.out_dir, f"weights-{task}.npy"), weights)
