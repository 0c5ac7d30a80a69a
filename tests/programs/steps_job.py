"""A 2-worker MultiWorkerMirrored job for tests/test_steps.py, run by `kdist launch`:

    python tests/programs/steps_job.py MODE OUT

MODE `hang`: worker 1 stops itself (SIGSTOP) before the 21st step of the second epoch, as a hung
host would; the
watchdog of worker 0 (KDIST_HANG_TIMEOUT, KDIST_HANG_ACTION from the environment) reports it.
MODE `straggle`: worker 1 joins the CPU cgroup named by STEPS_JOB_CGROUP (a slow machine) and
both train 2 epochs; each worker writes OUT/<task>.json with its History.
"""

import json
import os
import signal
import sys

import kdist

mode, out = sys.argv[1], sys.argv[2]
spec = kdist.cluster()
strategy = kdist.strategy()
import keras  # noqa: E402
import numpy as np  # noqa: E402

if mode == "straggle" and spec.task_index == 1:
    with open(os.path.join(os.environ["STEPS_JOB_CGROUP"], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


class StopBefore21st(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if mode == "hang" and spec.task_index == 1 and (self.epoch, batch) == (1, 20):
            os.kill(os.getpid(), signal.SIGSTOP)


rng = np.random.default_rng(0)
x, y = rng.normal(size=(4096, 64)).astype("float32"), rng.integers(0, 10, 4096)
with kdist.scope():
    width = 1024 if mode == "straggle" else 256  # straggle: steps long enough for the CPU quota
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
# straggle: Keras's progress bar on (the chief's), so kdist's lines must start lines of their own
history = model.fit(x, y, batch_size=512 if mode == "straggle" else 128, epochs=2,
                    verbose="auto" if mode == "straggle" else 0,
                    callbacks=[StopBefore21st()])
with open(os.path.join(out, f"{spec.task_type}:{spec.task_index}.json"), "w") as f:
    json.dump(history.history, f)
