"""Parameter-server synchronisation modes (`kdist.scope(ps_sync=...)`), run by tests/test_ps_sync.py
as `kdist launch --chief --workers 3 --ps 2 -- python tests/programs/ps_sync_job.py OUT`.

Every task runs this script; ps and worker tasks serve and exit when the chief is done. The chief
trains one small MLP per case and writes OUT/sync.json:
  ksync3_equal    ksync:3 on one fixed batch (every worker's gradient at the same variables is the
                  same), against plain Keras SGD on that batch for as many updates
  stopped_ksyncK  ksync:2 and ksync:3 while worker 2 is SIGSTOPped in epoch 1: optimizer updates
                  counted during the stop, which lasts STOP_SECONDS for ksync:3 (it must not
                  update) and until 2 updates, at most PROGRESS_SECONDS, for ksync:2
  stale0, kbatch2 the modes' epoch logs and staleness histograms on shuffled data
  refused         ps_sync errors (bad value)
  closures_while_stopped[_upstream]  TensorFlow's coordinator alone, worker 2 stopped while a
                  deletion waits for it: closures the others complete, with kdist's fix and without
  on_the_worker   the ops of the critical section placed where the step runs (the worker)
"""

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time

import kdist

out_dir = sys.argv[1]
spec = kdist.cluster()
kdist.strategy()  # ps and worker tasks serve here and exit when the chief is done
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from kdist import model_state  # noqa: E402
from kdist.keras_seam import patches as keras_seam  # noqa: E402
from ps_helpers import ExampleCount, task_process  # noqa: E402

STEPS, BATCH, STOP_SECONDS, PROGRESS_SECONDS = 16, 32, 6, 60
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x[:, :4].sum(1) > x[:, 4:].sum(1)).astype("int32")
report = {}


def mlp():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2)])


def build(mode):
    keras.utils.set_random_seed(1)
    with kdist.scope(ps_sync=mode):
        model = mlp()
        model.compile(keras.optimizers.SGD(0.1),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[ExampleCount()])
    return model


def sigcont_later(process, seconds):
    """Sends `process` SIGCONT after `seconds`, from a process of its own: a TensorFlow call of
    this one that waits for the stopped worker may hold the GIL, and then no Python timer runs.
    Cancel it with `cancel(safety)` once the worker is resumed."""
    return subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {process.pid}"])


def cancel(safety):
    safety.kill()
    safety.wait()


class StopWorker(keras.callbacks.Callback):
    """SIGSTOPs worker 2 when epoch 1 begins and SIGCONTs it once `until_updates` optimizer
    updates were applied meanwhile (at most PROGRESS_SECONDS later), or, without it,
    STOP_SECONDS later; counts the updates and the seconds.

    While worker 2 is stopped, the chief must not wait for it outside the training itself. The
    tf2.17 tier hung in that window, the chief's main thread in its garbage collector freeing a
    traced function (`context.remove_function`, which removes it from every worker and can wait
    for worker 2); any TensorFlow op of the chief, such as the read of the update count before
    the SIGCONT, may then wait too. So the collector is off during the stop, and another process
    sends the SIGCONT even if the read waits (`sigcont_later`)."""

    def __init__(self, until_updates=None):
        super().__init__()
        self.until_updates = until_updates

    def _stopped_for(self, before):
        """Waits while worker 2 is stopped; returns the updates applied meanwhile."""
        if self.until_updates is None:
            time.sleep(STOP_SECONDS)
            return int(self.model.optimizer.iterations.numpy()) - before
        deadline = time.monotonic() + PROGRESS_SECONDS
        while True:
            updates = int(self.model.optimizer.iterations.numpy()) - before
            if updates >= self.until_updates or time.monotonic() > deadline:
                return updates
            time.sleep(0.1)

    def on_epoch_begin(self, epoch, logs=None):
        if epoch != 1:
            return
        process = task_process(spec, "worker", 2)
        gc.collect()
        gc.disable()
        process.send_signal(signal.SIGSTOP)
        # started before any TensorFlow op of the chief: the read just below may wait too
        longest = STOP_SECONDS if self.until_updates is None else PROGRESS_SECONDS
        self.safety = sigcont_later(process, longest + 5)
        before = int(self.model.optimizer.iterations.numpy())

        def resume():
            started = time.monotonic()
            try:
                self.updates_while_stopped = self._stopped_for(before)
            finally:
                self.seconds_stopped = time.monotonic() - started
                process.send_signal(signal.SIGCONT)
                cancel(self.safety)
                gc.enable()
            # The tf2.17 tier also hung with worker 2 still stopped after this thread had ended
            # (its stacks, from kdist launch --timeout): SIGCONT again until the epoch ends.
            for _ in range(60):  # at most 2 minutes: a failed fit ends the program all the same
                if self.epoch_ended.wait(2):
                    break
                process.send_signal(signal.SIGCONT)

        self.epoch_ended = threading.Event()
        self.thread = threading.Thread(target=resume)
        self.thread.start()

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            self.epoch_ended.set()


# ksync:3 on one fixed batch: each update is the mean of 3 identical gradients
model = build("ksync:3")
initial = model.get_weights()
fixed = x[:BATCH], y[:BATCH]
history = model.fit(lambda context: tf.data.Dataset.from_tensors(fixed), epochs=2,
                    steps_per_epoch=STEPS, verbose=0).history
updates = int(model.optimizer.iterations.numpy())
reference = mlp()
reference.set_weights(initial)
reference.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
for _ in range(updates):
    reference.train_on_batch(*fixed)
report["ksync3_equal"] = {
    "history": history, "updates": updates, "stats": kdist.ps.sync_stats(model),
    "max_weight_difference": max(float(np.abs(a - b).max()) for a, b in
                                 zip(model.get_weights(), reference.get_weights()))}



def closures_while_worker_2_is_stopped(strategy, wait):
    """TensorFlow alone (its coordinator, a ps counter): worker 2 is stopped while the deletion of
    a tensor that lives on it is pending, then 8 closures that count on the ps are scheduled; the
    closures counted within `wait` seconds (at most 8; the one worker 2 took waits for it).
    Upstream, each other worker's thread, leaving its first closure, waits for that deletion
    (fix ps_steps_without_waiting_for_a_frozen_worker): 2 at most."""
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def count():
        counter.assign_add(1)

    coordinator.schedule(count)  # traced and sent to every worker before the stop
    coordinator.join()
    process = task_process(spec, "worker", 2)
    with tf.device("/job:worker/replica:0/task:2"):
        held = tf.constant([1.0]) * 2.0
    gc.collect()
    gc.disable()
    process.send_signal(signal.SIGSTOP)
    safety = sigcont_later(process, wait + 5)
    try:
        del held  # its deletion waits for worker 2
        for _ in range(8):
            coordinator.schedule(count)
        deadline = time.monotonic() + wait
        while int(counter.numpy()) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        return int(counter.numpy()) - 1
    finally:
        process.send_signal(signal.SIGCONT)
        cancel(safety)
        gc.enable()
        coordinator.join()


# Fix ps_steps_without_waiting_for_a_frozen_worker: the other workers' closures go on (waiting up
# to 30 s for 7 of 8); upstream (the fix uninstalled) they stop after one each (a 10 s window).
strategy = model.distribute_strategy
report["closures_while_stopped"] = closures_while_worker_2_is_stopped(strategy, 30)
frozen_fix = keras_seam.patch("ps_steps_without_waiting_for_a_frozen_worker")
frozen_fix.uninstall()
report["closures_while_stopped_upstream"] = closures_while_worker_2_is_stopped(strategy, 10)
frozen_fix.install()


def on_the_worker(graph, inside=False):
    """The ops of the sync's critical section in `graph` (and its branches) without a ps device
    that compute (not a resource op, which runs where its variable is): a worker stopped while
    holding the mutex would hold every update until they ran."""
    found = []
    for op in graph.get_operations():
        within = inside or "critical_section_execute" in op.name
        computes = op.type not in ("Placeholder", "NoOp", "Const") and not any(
            t.dtype == tf.resource for t in op.inputs)
        if within and computes and "/job:ps" not in op.device:
            found.append(f"{op.type} {op.name} {op.device!r}")
        for attr in ("then_branch", "else_branch"):
            if attr in op.node_def.attr:
                found += on_the_worker(graph._get_function(op.node_def.attr[attr].func.name).graph,
                                       within)
    return found


trained = [function for key, function in model_state.of(model).functions.items()
           if key[0].startswith("train")]
report["on_the_worker"] = [found for function in trained
                           for concrete in function._list_all_concrete_functions()
                           for found in on_the_worker(concrete.graph)]
report["sections_seen"] = sum("critical_section_execute" in op.name for function in trained
                              for concrete in function._list_all_concrete_functions()
                              for op in concrete.graph.get_operations())

for mode in ("ksync:2", "ksync:3"):
    model = build(mode)
    stop = StopWorker(until_updates=2 if mode == "ksync:2" else None)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, steps_per_epoch=STEPS, verbose=0,
                        callbacks=[stop]).history
    stop.thread.join()
    report[f"stopped_{mode.replace(':', '')}"] = {
        "history": history, "updates_while_stopped": stop.updates_while_stopped,
        "seconds_stopped": stop.seconds_stopped}

for mode in ("stale:0", "kbatch:2"):
    model = build(mode)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, steps_per_epoch=STEPS, verbose=0).history
    report[mode.replace(":", "")] = {"history": history, "stats": kdist.ps.sync_stats(model),
                                     "iterations": int(model.optimizer.iterations.numpy())}

try:
    with kdist.scope(ps_sync="ksync:0"):
        pass
except ValueError as err:
    report["refused"] = str(err)

with open(os.path.join(out_dir, "sync.json"), "w") as f:
    json.dump(report, f)
print("ps_sync_job done")
