"""Scenarios of a Keras user on MultiWorkerMirrored, written the way the TensorFlow tutorials
(multi-worker training with Keras; distributed input; save and load) and the Keras guides do
things, with only the two kdist lines added. Every worker runs this file; each writes
OUT/<task>.json with what happened in each scenario (an outcome, or the error it raised).

    kdist launch --workers 2 -- python multi_worker_tutorial.py OUT
"""

import json
import os
import sys
import traceback

import numpy as np
import tensorflow as tf
import keras

import kdist  # kdist line 1 (imported with the others, as users do)

out_dir = sys.argv[1]
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
task = f"{tf_config['task']['type']}:{tf_config['task']['index']}"
PER_WORKER_BATCH, STEPS = 32, 10
GLOBAL_BATCH = PER_WORKER_BATCH * num_workers
rng = np.random.default_rng(0)
x = rng.normal(size=(640, 12)).astype("float32")
y = (x[:, :6].sum(1) > x[:, 6:].sum(1)).astype("int64")
report = {}


def scenario(name):
    """Runs the decorated scenario now; records its outcome or its error (never stops the job:
    every worker must run every scenario, in the same order, for the collectives to match)."""
    def run(function):
        try:
            report[name] = {"ok": True, **(function() or {})}
        except Exception as err:  # noqa: BLE001 (recorded for the test to judge)
            report[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:600],
                            "trace": traceback.format_exc()[-1500:]}
        return function

    return run


def build_and_compile():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def weights_digest(model):
    return float(sum(np.sum(np.abs(w)) for w in model.get_weights()))


# The tutorials' order: the dataset exists before the strategy.
train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(640, seed=1).repeat() \
    .batch(GLOBAL_BATCH)

with kdist.scope() as strategy:  # kdist line 2
    model = build_and_compile()
model_initial = model.get_weights()


@scenario("tutorial_fit")
def _():
    history = model.fit(train_dataset, epochs=3, steps_per_epoch=STEPS, verbose=0,
                        callbacks=[keras.callbacks.BackupAndRestore(os.path.join(out_dir, "tmp_b"))])
    return {"loss": history.history["loss"], "replicas": strategy.num_replicas_in_sync,
            "digest": weights_digest(model)}


@scenario("save_on_chief_then_load_everywhere")
def _():
    path = os.path.join(out_dir, "saved.keras")
    if kdist.cluster().is_chief:
        model.save(path)
    kdist.barrier()
    with kdist.scope():
        restored = keras.saving.load_model(path)
    restored_digest = weights_digest(restored)
    evaluated = restored.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    restored.fit(train_dataset, epochs=1, steps_per_epoch=2, verbose=0)  # training continues
    return {"restored_digest_before": restored_digest, "saved_digest": weights_digest(model),
            "restored_accuracy": evaluated["accuracy"], "continued_digest": weights_digest(restored)}


@scenario("backup_and_restore_resumes")
def _():
    backup = os.path.join(out_dir, "backup")
    with kdist.scope():
        first = build_and_compile()
    first.fit(train_dataset, epochs=2, steps_per_epoch=STEPS, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    with kdist.scope():
        second = build_and_compile()
    history = second.fit(train_dataset, epochs=4, steps_per_epoch=STEPS, verbose=0,
                         callbacks=[keras.callbacks.BackupAndRestore(backup)])
    return {"epochs_run": len(history.history["loss"]), "backup_left": os.path.exists(backup)}


@scenario("distribute_datasets_from_function")
def _():
    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return dataset.shard(input_context.num_input_pipelines,
                             input_context.input_pipeline_id).batch(batch)

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    with kdist.scope():
        fresh = build_and_compile()
    history = fresh.fit(distributed, epochs=2, steps_per_epoch=STEPS, verbose=0)
    return {"loss": history.history["loss"], "digest": weights_digest(fresh)}


@scenario("auto_shard_policy_data")
def _():
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)
    with kdist.scope():
        fresh = build_and_compile()
    history = fresh.fit(dataset, epochs=2, verbose=0)
    return {"loss": history.history["loss"], "digest": weights_digest(fresh)}


class CustomStep(keras.Model):
    """A subclassed model with its own train_step, as in the Keras 'customizing fit' guide."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(2)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, inputs):
        return self.out(self.hidden(inputs))

    def train_step(self, data):
        features, labels = data
        with tf.GradientTape() as tape:
            logits = self(features, training=True)
            loss = self.compute_loss(y=labels, y_pred=logits)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


@scenario("custom_train_step")
def _():
    with kdist.scope():
        custom = CustomStep()
        custom.compile(optimizer=keras.optimizers.SGD(0.05),
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = custom.fit(train_dataset, epochs=3, steps_per_epoch=STEPS, verbose=0)
    return {"loss": history.history["loss"], "digest": weights_digest(custom)}


@scenario("steps_per_execution")
def _():
    results = {}
    for k in (1, 4):
        with kdist.scope():
            fresh = build_and_compile()
            fresh.compile(optimizer=keras.optimizers.SGD(0.05),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          steps_per_execution=k)
        fresh.set_weights(model_initial)
        fresh.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        results[k] = fresh
    return {"iterations": int(results[4].optimizer.iterations.numpy()),
            "max_diff_vs_1": max(float(np.abs(a - b).max()) for a, b in
                                 zip(results[4].get_weights(), results[1].get_weights()))}


@scenario("stock_callbacks_list")
def _():
    folder = os.path.join(out_dir, "callbacks")
    with kdist.scope():
        fresh = build_and_compile()
    history = fresh.fit(
        train_dataset, epochs=4, steps_per_epoch=STEPS, verbose=0, validation_data=(x, y),
        callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(folder, "ckpt-{epoch:02d}.keras")),
                   keras.callbacks.ModelCheckpoint(os.path.join(folder, "best.weights.h5"),
                                                   save_best_only=True, save_weights_only=True),
                   keras.callbacks.CSVLogger(os.path.join(folder, "history.csv")),
                   keras.callbacks.TensorBoard(os.path.join(folder, "logs")),
                   keras.callbacks.EarlyStopping(monitor="val_loss", patience=1,
                                                 min_delta=10.0),  # stops after epoch 2
                   keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5),
                   keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: None)])
    kdist.barrier()
    return {"epochs_run": len(history.history["loss"]),
            "learning_rate": float(fresh.optimizer.learning_rate.numpy()),
            "files": sorted(os.listdir(folder)) if os.path.isdir(folder) else []}


@scenario("mixed_precision")
def _():
    results = {}
    for policy in ("mixed_float16", "mixed_bfloat16"):
        keras.mixed_precision.set_global_policy(policy)
        try:
            with kdist.scope(compression=kdist.compression.from_name("fp16")):
                fresh = build_and_compile()
            history = fresh.fit(train_dataset, epochs=2, steps_per_epoch=STEPS, verbose=0)
            results[policy] = {"loss": history.history["loss"],
                               "optimizer": type(fresh.optimizer).__name__,
                               "digest": weights_digest(fresh)}
        finally:
            keras.mixed_precision.set_global_policy("float32")
    return results


@scenario("jit_compile")
def _():
    results = {}
    for jit in ("auto", True):
        with kdist.scope():
            fresh = build_and_compile()
            fresh.compile(optimizer=keras.optimizers.SGD(0.05),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          jit_compile=jit)
        try:
            fresh.fit(train_dataset, epochs=1, steps_per_epoch=STEPS, verbose=0)
            results[str(jit)] = {"trained": True, "jit_compile": fresh.jit_compile}
        except ValueError as err:
            results[str(jit)] = {"trained": False, "error": str(err)}
    return results


@scenario("options_after_the_first_op")
def _():
    try:
        with kdist.scope(all_reduce="ring"):
            pass
    except RuntimeError as err:
        return {"refused": str(err)}
    return {"refused": None}


with open(os.path.join(out_dir, f"{task}.json"), "w") as f:
    json.dump(report, f)
print("conformance done", task)
