"""Keras 3 under ParameterServerStrategy, run by tests/test_parameter_server.py as
`kdist launch --spec cluster_specs/local-ps.json -- python tests/programs/ps_job.py OUT MODE`.

Every task runs this script: on ps and worker tasks `kdist.strategy()` serves and exits when the
chief is done. The chief trains and writes OUT/<MODE>.json. MODE:
  train      fit with partitioned layers and the file-writing callbacks, SIGKILL worker 1 at the
             start of epoch 2, evaluate, predict; fit from a dataset function, from a
             tf.data.Dataset built here, and one from a Python generator
  kill_ps    BackupAndRestore every epoch, SIGKILL ps 1 at the start of epoch 2 (on the first run
             only, KDIST_RESTART_COUNT=0): fit must fail clearly; restarted by the launcher, the
             same fit resumes from the backup. Writes OUT/kill_ps-<restart>.json.
  sharded    the strategy has a variable_partitioner (the tutorials' way to shard over the ps):
             fit must refuse its ShardedVariables with the fix, before any step runs
  workers    ps_shard_input=True: which example ids each worker trained on and how many steps it
             ran (2 epochs of 24: the second starts with both workers warm), from NumPy input
             and from a dataset function; then evaluation on the workers with worker 1 SIGKILLed
             while shards run
"""

import json
import os
import signal
import sys

import kdist

out_dir, mode = sys.argv[1], sys.argv[2]
spec = kdist.cluster()
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from ps_helpers import ExampleCount, task_process  # noqa: E402

partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=256, max_shards=2) if mode == "sharded" else None
# ps/worker tasks serve here and exit when the chief is done
options = {"workers": {"ps_shard_input": True}, "kill_ps": {"ps_evaluation": "chief"}}
strategy = kdist.strategy(variable_partitioner=partitioner, **options.get(mode, {}))

from kdist.ps import ParameterServerFailure  # noqa: E402

STEPS, BATCH = 16, 32
rng = np.random.default_rng(0)
x = rng.normal(size=(600, 8)).astype("float32")
y = (x[:, :4].sum(1) > x[:, 4:].sum(1)).astype("int32")
report = {"strategy": type(strategy).__name__, "mode": mode}


class KillTask(keras.callbacks.Callback):
    """SIGKILLs one task of the cluster when epoch `epoch` begins, or when evaluation schedules
    shard `test_batch` while the earlier shards run (test instrumentation)."""

    def __init__(self, task_type, index, epoch=None, test_batch=None):
        super().__init__()
        self.task, self.epoch, self.test_batch = (task_type, index), epoch, test_batch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.kill()

    def on_test_batch_begin(self, batch, logs=None):
        if batch == self.test_batch:
            self.kill()

    def kill(self):
        process = task_process(spec, *self.task)
        if process is not None:
            process.send_signal(signal.SIGKILL)
            report["killed_pid"] = process.pid


class Visits(keras.metrics.Metric):
    """How often each worker trained on each example id (the id is feature 0)."""

    def __init__(self, workers, examples, name="visits", **kwargs):
        super().__init__(name=name, **kwargs)
        self.counts = self.add_variable(shape=(workers, examples), initializer="zeros",
                                        name="counts")

    def update_state(self, ids, y_pred=None, sample_weight=None):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        ids = tf.cast(ids, "int32")
        indices = tf.stack([tf.fill(tf.shape(ids), tf.cast(worker, "int32")), ids], axis=1)
        self.counts.assign_add(tf.scatter_nd(indices, tf.ones_like(ids, "float32"),
                                             self.counts.shape))

    def result(self):
        return tf.reduce_sum(self.counts)


def make_model():
    with kdist.scope():
        model = keras.Sequential([keras.Input((8,)),
                                  kdist.layers.PartitionedDense(64, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.Adam(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy", ExampleCount()])
    return model


def devices(model):
    return {v.path: v.value.device for v in model.variables}


if mode == "train":
    model = make_model()
    # patience 3 > epochs: asynchronous SGD may raise val_loss for an epoch; the callback still runs
    early_stopping = keras.callbacks.EarlyStopping(monitor="val_loss", patience=3)
    history = model.fit(x, y, batch_size=BATCH, epochs=3, steps_per_epoch=STEPS,
                        validation_data=(x, y), callbacks=[
                            KillTask("worker", 1, epoch=1), early_stopping,
                            kdist.callbacks.ModelCheckpoint(os.path.join(out_dir, "ckpt-{epoch}.keras")),
                            kdist.callbacks.TensorBoard(os.path.join(out_dir, "tensorboard"))])
    report["history"] = history.history
    report["early_stopping_best"] = float(early_stopping.best)
    report["devices"] = devices(model)
    report["evaluate"] = model.evaluate(x, y, batch_size=50, return_dict=True, verbose=0)
    logits = model.predict(x, batch_size=64, verbose=0)
    local = model(x).numpy()
    report["predict_rows"], report["predict_max_diff"] = len(logits), float(np.abs(logits - local).max())
    report["reference_accuracy"] = float((local.argmax(1) == y).mean())
    report["reference_loss"] = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
        y, local))
    with kdist.scope():
        tokens = keras.Input((5,), dtype="int32")
        pooled = keras.layers.GlobalAveragePooling1D()(kdist.layers.PartitionedEmbedding(101, 8)(tokens))
        embedding_model = keras.Model(tokens, keras.layers.Dense(2)(pooled))
        embedding_model.compile(keras.optimizers.Adam(0.05),
                                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                steps_per_execution=3)  # 16 steps: 5 calls of 3, then 1 of 1
    ids = rng.integers(0, 101, size=(400, 5)).astype("int32")
    labels = (ids.max(1) > 90).astype("int32")
    contexts = []

    def dataset_fn(context):
        contexts.append((context.input_pipeline_id, context.num_input_pipelines))
        dataset = tf.data.Dataset.from_tensor_slices((ids, labels)).shuffle(len(ids))
        return dataset.shard(context.num_input_pipelines, context.input_pipeline_id).batch(BATCH)

    report["embedding_loss"] = embedding_model.fit(dataset_fn, epochs=3, steps_per_epoch=STEPS,
                                                   verbose=0).history["loss"]
    report["input_contexts"] = sorted(set(contexts))
    report["embedding_iterations"] = int(embedding_model.optimizer.iterations.numpy())
    try:
        with kdist.scope(compression=kdist.compression.FP16()):
            pass
    except ValueError as err:
        report["compression_refused"] = str(err)
    report["embedding_devices"] = devices(embedding_model)
    # The most common input: a tf.data.Dataset built right here from arrays, validation too.
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).repeat() \
        .map(lambda features, label: (features * 1.0, label)).batch(BATCH)
    validation = tf.data.Dataset.from_tensor_slices((x, y)).batch(100)
    dataset_model = make_model()
    report["dataset_history"] = dataset_model.fit(dataset, epochs=3, steps_per_epoch=STEPS,
                                                  validation_data=validation,
                                                  verbose=0).history
    def generated():  # noqa: E306
        yield x[:BATCH], y[:BATCH]

    generator_dataset = tf.data.Dataset.from_generator(
        generated, output_signature=(tf.TensorSpec((None, 8), tf.float32),
                                     tf.TensorSpec((None,), tf.int32)))
    try:
        make_model().fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # no steps_per_epoch
    except ValueError as err:
        report["missing_steps_per_epoch"] = str(err)
    report["generator_history"] = make_model().fit(
        generator_dataset, epochs=2, steps_per_epoch=4, verbose=0,
        validation_data=lambda context: tf.data.Dataset.from_tensor_slices((x, y)).batch(100)
    ).history
elif mode == "sharded":
    with kdist.scope(variable_partitioner=partitioner):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64), keras.layers.Dense(2)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    report["sharded_kernels"] = sum(type(v.value).__name__ == "ShardedVariable"
                                    for v in model.trainable_variables)
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=STEPS, verbose=0)
    except ValueError as err:
        report["sharded_refused"] = str(err)
    report["iterations"] = int(model.optimizer.iterations.numpy())
elif mode == "workers":
    ids = np.arange(256)
    features = np.concatenate([ids[:, None], rng.normal(size=(256, 7))], axis=1).astype("float32")
    labels = (features[:, 1] > 0).astype("int32")
    for source in ("numpy", "function"):
        with kdist.scope():
            inputs = keras.Input((8,))
            id_model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
            visits = Visits(2, 256)
            id_model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))

        def train_step_ids(data, visits=visits):
            visits.update_state(data[0][:, 0], None)  # records ids; nothing to train
            return {}

        id_model.train_step = train_step_ids
        if source == "numpy":
            id_model.fit(features, labels, batch_size=BATCH, epochs=2, steps_per_epoch=24,
                         verbose=0)
        else:
            def sharded(context):
                dataset = tf.data.Dataset.from_tensor_slices((features, labels))
                return dataset.shard(context.num_input_pipelines,
                                     context.input_pipeline_id).batch(BATCH)

            id_model.fit(sharded, epochs=2, steps_per_epoch=24, verbose=0)
        counts = visits.counts.numpy()
        report[f"ids_{source}"] = [np.flatnonzero(row).tolist() for row in counts]
        report[f"steps_{source}"] = [int(row.sum()) // BATCH for row in counts]
    model = make_model()
    model.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=STEPS, verbose=0)
    big_x = rng.normal(size=(20000, 8)).astype("float32")
    big_y = (big_x[:, :4].sum(1) > big_x[:, 4:].sum(1)).astype("int32")
    report["evaluate"] = model.evaluate(big_x, big_y, batch_size=50, return_dict=True, verbose=0,
                                        callbacks=[KillTask("worker", 1, test_batch=1)])
    local = model(big_x).numpy()
    report["reference_accuracy"] = float((local.argmax(1) == big_y).mean())
    report["reference_loss"] = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
        big_y, local))
    try:
        make_model().fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=1,
                         steps_per_epoch=2, verbose=0)
    except ValueError as err:
        report["dataset_object_refused"] = str(err)
else:
    model = make_model()
    backup = kdist.callbacks.BackupAndRestore(os.path.join(out_dir, "backup"))
    restart = os.environ.get("KDIST_RESTART_COUNT", "0")
    mode = f"{mode}-{restart}"
    callbacks = [backup] + ([KillTask("ps", 1, epoch=1)] if mode == "kill_ps-0" else [])
    try:
        history = model.fit(x, y, batch_size=BATCH, epochs=3, steps_per_epoch=STEPS, verbose=0,
                            callbacks=callbacks)
        report["epochs_run"] = len(history.history["loss"])
        report["final_loss"] = history.history["loss"][-1]
        report["evaluate"] = model.evaluate(x, y, batch_size=50, return_dict=True, verbose=0)
        local = model(x).numpy()
        report["reference_accuracy"] = float((local.argmax(1) == y).mean())
    except ParameterServerFailure as err:
        report["error"] = str(err)

with open(os.path.join(out_dir, f"{mode}.json"), "w") as f:
    json.dump(report, f)
print("ps_job done", mode)
sys.exit(3 if "error" in report else 0)
