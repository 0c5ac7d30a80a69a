"""A Keras user's parameter-server script, the way the "parameter server training" tutorial's
Keras section goes (a dataset function with an input context, `steps_per_execution`, callbacks,
`steps_per_epoch`, evaluate), with the two kdist lines. Every task runs it; the chief trains and
writes OUT/chief.json (ps and worker tasks serve inside `kdist.scope()` and exit with the chief).

    kdist launch --chief --workers 2 --ps 2 -- python parameter_server_tutorial.py OUT
"""

import json
import os
import sys

import kdist  # kdist line 1
import keras
import numpy as np
import tensorflow as tf

out_dir = sys.argv[1]
rng = np.random.default_rng(0)
features = rng.random((1000, 10)).astype("float32")
targets = (features.sum(1) > 5).astype("int64")


def dataset_fn(input_context):
    global_batch_size = 64
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = tf.data.Dataset.from_tensor_slices((features, targets)).shuffle(1000).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size).prefetch(2)


with kdist.scope() as strategy:  # kdist line 2; ps and worker tasks serve here, then exit
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=10)

folder = os.path.join(out_dir, "run")
history = model.fit(dataset_fn, epochs=4, steps_per_epoch=20, verbose=0, callbacks=[
    keras.callbacks.TensorBoard(os.path.join(folder, "logs")),
    keras.callbacks.ModelCheckpoint(os.path.join(folder, "ckpt.keras")),
    keras.callbacks.BackupAndRestore(os.path.join(folder, "backup"))])
evaluation = model.evaluate(features, targets, batch_size=100, return_dict=True, verbose=0)
one_device = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                               keras.layers.Dense(2)])  # the same weights, evaluated by plain Keras
one_device.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=["accuracy"])
one_device.set_weights(model.get_weights())
evaluation_one_device = one_device.evaluate(features, targets, batch_size=100, return_dict=True,
                                            verbose=0)
keras.mixed_precision.set_global_policy("mixed_float16")
try:
    with kdist.scope():
        mixed = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        mixed.compile(keras.optimizers.SGD(learning_rate=0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    mixed_result = {"loss": mixed.fit(dataset_fn, epochs=2, steps_per_epoch=20,
                                      verbose=0).history["loss"]}
except Exception as err:  # noqa: BLE001 (recorded for the test to judge)
    mixed_result = {"error": f"{type(err).__name__}: {err}"[:500]}
finally:
    keras.mixed_precision.set_global_policy("float32")
with open(os.path.join(out_dir, "chief.json"), "w") as f:
    json.dump({"mixed_float16": mixed_result, "strategy": type(strategy).__name__, "loss": history.history["loss"],
               "accuracy": history.history["accuracy"], "evaluation": evaluation,
               "evaluation_one_device": evaluation_one_device,
               "iterations": int(model.optimizer.iterations.numpy()),
               "files": sorted(os.listdir(folder))}, f)
