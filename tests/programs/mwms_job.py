"""Keras 3 under MultiWorkerMirroredStrategy, run by tests/test_multi_worker.py as
`kdist launch --workers 2 -- python tests/programs/mwms_job.py OUT_DIR`.

Every worker runs the same steps (collectives must match) and writes what it saw to
OUT_DIR/<task>.json and OUT_DIR/<task>-weights.npz; the test compares the workers.
"""

import atexit
import glob
import json
import os
import sys
import tempfile
import time

out_dir = sys.argv[1]
# Registered before kdist's own exit handlers, so it runs after them: when this worker really leaves.
_index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
atexit.register(lambda: open(os.path.join(out_dir, f"left-{_index}"), "w").write(repr(time.time())))

import kdist  # noqa: E402

spec = kdist.cluster()
strategy = kdist.strategy()  # first thing: MWMS must exist before any other TF op

import keras  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402
from kdist.keras_seam import patches as keras_seam  # noqa: E402
from kdist import global_state  # noqa: E402
from kdist.exchange import host_rows  # noqa: E402
from kdist.keras_seam import classes, hooks  # noqa: E402
from kdist.keras_seam.registry import FIX, Patch, Target  # noqa: E402
from kdist.keras_seam.versions import version  # noqa: E402
from collective_counts import reduces  # noqa: E402

TFEpochIterator = classes.resolve("TFEpochIterator")  # TensorFlowTrainer's module, whatever its name

keras.utils.set_random_seed(0)  # the same initial weights in every run: the accuracy bound is not luck
report = {"task": spec.task, "is_chief": spec.is_chief, "strategy": type(strategy).__name__,
          "replicas": strategy.num_replicas_in_sync}
rng = np.random.default_rng(0)  # identical data on every worker, as with a shared file
x = rng.normal(size=(203, 8)).astype("float32")  # 203: the last global batch is uneven
y = (x[:, :4].sum(1) > x[:, 4:].sum(1)).astype("int32")
GLOBAL_BATCH = kdist.global_batch_size(16)


def make_model():
    with kdist.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.1),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def error_of(fn):
    try:
        fn()
    except Exception as err:  # the upstream bug, recorded for the test
        return f"{type(err).__name__}: {err}"[:300]
    return None


def epoch_iterators(epoch_iterator):
    """The tf.data iterator of each execution of a `TFEpochIterator`'s epoch: Keras <= 3.6 hands
    them out through `enumerate_epoch()`, later ones by iterating it (the iterator is the last
    item of each tuple)."""
    executions = epoch_iterator.enumerate_epoch() if version(keras.__version__) < (3, 7, 0) \
        else iter(epoch_iterator)
    for *_, iterator in executions:
        yield iterator


def shard_of_one_epoch(epochs=1):
    """Indices this worker's replicas get from Keras's in-memory pipeline in each shuffled epoch
    (the first alone when `epochs` is 1), 61 rows in batches of 8 (a short last batch)."""
    indices = np.arange(61, dtype="float32").reshape(-1, 1)
    iterator = TFEpochIterator(x=indices, batch_size=8, shuffle=True, distribute_strategy=strategy)
    shards = []
    for _ in range(epochs):
        seen = []
        with iterator.catch_stop_iteration():
            for it in epoch_iterators(iterator):
                batch = tf.nest.flatten(next(it))[0]
                for value in strategy.experimental_local_results(batch):
                    seen += value.numpy().ravel().astype(int).tolist()
        shards.append(seen)
    return shards[0] if epochs == 1 else shards


def built_array_datasets(make):
    """How many in-memory datasets Keras builds (its `get_tf_dataset` run) in ``make()``."""
    built = []
    count = Patch("count_array_datasets", FIX, {Target("ArrayDataAdapter", "get_tf_dataset"): (
        lambda original: lambda adapter: built.append(1) or original(adapter))},
        why="the test's count", rank=-1)  # innermost: below kdist's fixes
    count.install()
    try:
        make()
    finally:
        count.uninstall()
    return len(built)


# 1. Regression evidence: each upstream bug still breaks Keras without kdist's workaround.
keras_seam.uninstall()
report["unpatched_fit_error"] = error_of(lambda: make_model().fit(x, y, batch_size=GLOBAL_BATCH,
                                                                  epochs=1, verbose=0))
report["unpatched_shard"] = shard_of_one_epoch()
report["unpatched_predict_on_batch_rows"] = len(make_model().predict_on_batch(x[:64]))
keras_seam.patch("symbolic_build_without_collective").install()
report["only_build_patched_fit_error"] = error_of(
    lambda: make_model().fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0))
report["workarounds"] = keras_seam.install()
report["patched_shard"] = shard_of_one_epoch()
report["patched_shards"] = shard_of_one_epoch(epochs=3)
report["array_datasets_built"] = {"patched": built_array_datasets(shard_of_one_epoch)}
keras_seam.uninstall()
report["array_datasets_built"]["unpatched"] = built_array_datasets(shard_of_one_epoch)
keras_seam.install()

# 2. fit on in-memory arrays (shuffled) with the multi-worker-safe callbacks.
model = make_model()
checkpoint = kdist.callbacks.ModelCheckpoint(os.path.join(out_dir, "ckpt", "model-{epoch}.keras"))
tensorboard = kdist.callbacks.TensorBoard(os.path.join(out_dir, "tensorboard"))
history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=4, validation_data=(x, y),
                    callbacks=[checkpoint, tensorboard])
report["loss"] = history.history["loss"]
report["val_accuracy"] = history.history["val_accuracy"]
report["checkpoint_dir"] = checkpoint.last_written_dir
report["leftover_temp_dirs"] = glob.glob(os.path.join(
    tempfile.gettempdir(), f"kdist-workertemp-{spec.task_type}-{spec.task_index}-*"))
# kdist's epoch reports (the replica check, the stragglers' figures) rode the TCP ring: no
# all-gather of TensorFlow's was traced for them
kept = global_state.of_strategy(model.distribute_strategy)
report["host_gathers_traced"] = len(kept.host_gathers)
report["host_rows"] = host_rows.per_worker(
    strategy, np.array([spec.task_index, spec.task_index + 0.5]), "test rows").tolist()

# 3. evaluate is exact: every example counted once, matching a local computation on all data.
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
evaluation = model.evaluate(dataset, return_dict=True, verbose=0)
logits = model(x).numpy()
report["evaluate"] = evaluation
report["reference_accuracy"] = float((logits.argmax(1) == y).mean())
report["reference_loss"] = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits))

# kdist reads the metrics outside a step in one sum over its TCP ring (hook
# metric_results_in_one_sum), and resets them without reading them back (fix
# metric_reset_without_collective): no TensorFlow collective, each of which leaves memory behind.
# Upstream (the hook uninstalled): one reduce per metric variable, the same values.
read_hook = keras_seam.patch("metric_results_in_one_sum")
report["metric_reads"] = {"ring": {k: float(v) for k, v in model.get_metrics_result().items()}}
report["metric_read_reduces"] = reduces(strategy, model.get_metrics_result)
read_hook.uninstall()
report["metric_reads"]["tf"] = {k: float(v) for k, v in model.get_metrics_result().items()}
report["metric_read_reduces_upstream"] = reduces(strategy, model.get_metrics_result)
read_hook.install()
report["metric_reset_reduces"] = reduces(strategy, model.reset_metrics)

# Upstream without kdist's metric fix (keras-team/keras#21061, Keras < 3.10): metric variables are
# not combined across workers, so each worker's evaluate counts only the examples it saw.
metric_fix = keras_seam.patch("metric_variables_synced_on_read")
report["keras"], report["metric_fix_active"] = keras.__version__, metric_fix.active
metric_fix.uninstall()
with strategy.scope():  # not kdist.scope(): it would install the fix again
    unsynced = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                 keras.layers.Dense(2)])
    unsynced.compile(keras.optimizers.SGD(0.1),
                     keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     metrics=["accuracy"])
unsynced.set_weights(model.get_weights())
report["unsynced_evaluate"] = unsynced.evaluate(dataset, return_dict=True, verbose=0)
if report["metric_fix_active"]:
    metric_fix.install()

# 4. predict returns every row, in input order (numpy and tf.data inputs).
report["predict_numpy_max_diff"] = float(np.abs(model.predict(x, batch_size=GLOBAL_BATCH,
                                                              verbose=0) - logits).max())
predicted = model.predict(tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH), verbose=0)
report["predict_rows"] = int(predicted.shape[0])
report["predict_on_batch_max_diff"] = float(np.abs(model.predict_on_batch(x[:64]) - logits[:64]).max())
report["predict_on_batch_rows"] = [len(model.predict_on_batch(x[:n])) for n in (64, 3, 1)]
report["predict_dataset_max_diff"] = float(np.abs(predicted - logits).max())
np.savez(os.path.join(out_dir, f"{spec.task}-weights.npz"), *model.get_weights())

# 5. dict inputs (keras-team/keras#20329): fit, evaluate, predict.
with kdist.scope():
    inputs = {"left": keras.Input((4,), name="left"), "right": keras.Input((4,), name="right")}
    merged = keras.layers.Concatenate()([inputs["left"], inputs["right"]])
    dict_model = keras.Model(inputs, keras.layers.Dense(2)(merged))
    dict_model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
features = {"left": x[:, :4], "right": x[:, 4:]}
dict_history = dict_model.fit(tf.data.Dataset.from_tensor_slices((features, y)).batch(GLOBAL_BATCH),
                              epochs=2, verbose=0)
report["dict_loss"] = dict_history.history["loss"]
report["dict_predict_max_diff"] = float(np.abs(
    dict_model.predict(features, batch_size=GLOBAL_BATCH, verbose=0)
    - dict_model(features).numpy()).max())

# 6. BackupAndRestore: a second fit resumes from the chief's backup on every worker.
backup_dir = os.path.join(out_dir, "backup")
resumed = make_model()
resumed.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, verbose=0,
            callbacks=[kdist.callbacks.BackupAndRestore(backup_dir, delete_checkpoint=False)])
weights_after_two = [w.tolist() for w in resumed.get_weights()]
again = make_model()
again_history = again.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3, verbose=0,
                          callbacks=[kdist.callbacks.BackupAndRestore(backup_dir)])
report["resumed_epochs_run"] = len(again_history.history["loss"])
report["resumed_from_backup"] = bool(again._initial_epoch == 2)
report["weights_after_two_checksum"] = float(sum(np.sum(w) for w in map(np.asarray, weights_after_two)))

# 6b. model.save on the chief, kdist.barrier(), then every worker loads the complete file.
saved = os.path.join(out_dir, "saved.keras")
if spec.is_chief:
    time.sleep(2)  # a slow filesystem: without the barrier, worker 1 would try to load first
    again.save(saved)
kdist.barrier()
report["loaded_after_barrier_same"] = all(
    np.array_equal(a, b) for a, b in zip(keras.saving.load_model(saved).get_weights(),
                                         again.get_weights()))

# 7. The sockets this process listens on (TF's gRPC server).
port = int(spec.address(spec.task_type, spec.task_index).rsplit(":", 1)[1])
report["listening"] = sorted({f"{c.laddr.ip}:{c.laddr.port}"
                              for c in psutil.Process().net_connections(kind="tcp")
                              if c.status == psutil.CONN_LISTEN and c.laddr.port == port})

# 8. The traced train step of kdist.scope() + fit against hand-written MWMS + fit with only the
#    workarounds fit needs to run: op types and counts (benchmarks/overhead.py times the two).
def train_step_ops(scope, **inputs_of_fit):
    with scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.1),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    model.fit(**(inputs_of_fit or {"x": x, "y": y, "batch_size": GLOBAL_BATCH, "shuffle": False}),
              epochs=1, verbose=0)
    counts = {}
    # Keras <= 3.6 returns the tf.function; 3.7-3.15 wrap it in a Python closure; 3.16 calls the
    # traced step from a closure inside that closure: every function reachable through closures.
    functions, pending, seen = [], [model.train_function], set()
    while pending:
        function = pending.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        functions.append(function)
        pending += [c.cell_contents for c in getattr(function, "__closure__", None) or ()
                    if callable(c.cell_contents) and not isinstance(c.cell_contents, type)
                    and not isinstance(c.cell_contents, keras.Model)]
    for function in functions:
        for concrete in getattr(function, "_list_all_concrete_functions", lambda: [])():
            for graph in [concrete.graph, *(f.graph for f in concrete.graph._functions.values()
                                            if hasattr(f, "graph"))]:
                for op in graph.get_operations():
                    counts[op.type] = counts.get(op.type, 0) + 1
    return counts


kdist_ops = train_step_ops(lambda: kdist.scope(watch_steps=False))


def endless_batches():
    while True:
        for start in range(0, len(x), GLOBAL_BATCH):
            yield x[start:start + GLOBAL_BATCH], y[start:start + GLOBAL_BATCH]


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return -(-len(x) // GLOBAL_BATCH)

    def __getitem__(self, index):
        rows = slice(index * GLOBAL_BATCH, (index + 1) * GLOBAL_BATCH)
        return x[rows], y[rows]


# TensorFlow's all-reduces in the step, by input: one more where the workers agree, at every
# step, on whether any replica still has data (TensorFlow's partial-batch handling)
report["all_reduces_by_input"] = {kind: train_step_ops(
    lambda: kdist.scope(watch_steps=False), **inputs_of_fit).get("CollectiveReduceV2", 0)
    for kind, inputs_of_fit in {
        "arrays, shuffled": {"x": x, "y": y, "batch_size": GLOBAL_BATCH},
        "generator": {"x": endless_batches(), "steps_per_epoch": 4},
        "PyDataset": {"x": Batches()}}.items()}
watched_ops = train_step_ops(kdist.scope)  # kdist.steps's clock readings added
# TopK's payloads (values, indices) gathered: over the ring where it sums the gradients
report["topk_step_ops"] = train_step_ops(lambda: kdist.scope(watch_steps=False,
                                                            compression="topk:0.1"))
keras_seam.uninstall()
for workaround in keras_seam.PATCHES:
    if workaround.name in ("symbolic_build_without_collective", "scalar_metric_reduce",
                           "loss_scaled_per_replica", "metric_variables_synced_on_read",
                           "loss_value_per_replica") \
            and workaround.applies(keras.__version__, tf.__version__):  # fit needs them to be right
        workaround.install()
kdist_hooks = hooks.connected()
hooks.connect(hooks.Hooks())  # by hand: Keras's own behaviour at every hook point
report["train_step_ops"] = {"kdist": kdist_ops, "by_hand": train_step_ops(strategy.scope),
                            "watched": watched_ops}
hooks.connect(kdist_hooks)
keras_seam.install()


# 9. Stock Keras callbacks, as a user writes them: each file written once, by the chief.
def files_under(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, names in os.walk(folder) for f in names)


def fit_with_stock_callbacks(folder):
    model = make_model()
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, validation_data=(x, y), verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(folder, "m.weights.h5"),
                                                         save_weights_only=True),
                         keras.callbacks.ModelCheckpoint(os.path.join(folder, "best.keras"),
                                                         save_best_only=True),
                         keras.callbacks.ModelCheckpoint(os.path.join(folder, "e{epoch}.keras")),
                         keras.callbacks.BackupAndRestore(os.path.join(folder, "backup"),
                                                          save_freq=2, delete_checkpoint=False),
                         keras.callbacks.CSVLogger(os.path.join(folder, "log.csv")),
                         keras.callbacks.TensorBoard(os.path.join(folder, "tb")),
                         keras.callbacks.EarlyStopping(patience=5),
                         keras.callbacks.ReduceLROnPlateau(patience=5),
                         keras.callbacks.TerminateOnNaN()])
    return model


stock = os.path.join(out_dir, "stock")
stock_model = fit_with_stock_callbacks(stock)
kdist.barrier()
report["stock_files"] = files_under(stock)
report["stock_csv_rows"] = len(open(os.path.join(stock, "log.csv")).read().splitlines())
report["stock_event_writers"] = len({name.rsplit(".", 2)[0].rsplit(".", 1)[-1] for name in
                                     os.listdir(os.path.join(stock, "tb", "train"))})
report["stock_weights_load"] = all(np.array_equal(a, b) for a, b in zip(
    keras.saving.load_model(os.path.join(stock, "e2.keras")).get_weights(),
    stock_model.get_weights()))
report["leftover_temp_dirs_after_stock"] = glob.glob(os.path.join(
    tempfile.gettempdir(), f"kdist-workertemp-{spec.task_type}-{spec.task_index}-*"))

# Upstream evidence (no crash needed): without the fix, each worker writes its own TensorBoard
# event file into the user's directory.
callbacks_fix = keras_seam.patch("multi_worker_file_callbacks")
callbacks_fix.uninstall()
unpatched = os.path.join(out_dir, "unpatched")
make_model().fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
                 callbacks=[keras.callbacks.TensorBoard(os.path.join(unpatched, "tb"))])
kdist.barrier()
report["unpatched_event_files"] = len(os.listdir(os.path.join(unpatched, "tb", "train")))
callbacks_fix.install()

with open(os.path.join(out_dir, f"{spec.task}.json"), "w") as f:
    json.dump(report, f)
print("mwms_job done", spec.task)
if spec.is_chief:  # the chief ends 3 s after the last collective: the other worker waits for it
    time.sleep(3)
    open(os.path.join(out_dir, "chief-ended"), "w").write(repr(time.time()))
