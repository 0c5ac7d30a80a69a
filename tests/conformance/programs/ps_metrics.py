"""A Keras user's parameter-server script with the metrics that keep thresholds and confusion
counts: fit from a dataset function with validation, EarlyStopping and ModelCheckpoint, then
evaluate; a second model trained and evaluated afterwards in the same process; repeated
evaluations. Every evaluation is compared with one device evaluating the same weights. And the
tutorial's Keras 2 line, `keras.utils.experimental.DatasetCreator(dataset_fn)`.

    kdist launch --spec cluster_specs/local-ps.json -- python ps_metrics.py OUT

The chief writes OUT/chief.json; ps and worker tasks serve (inside `kdist.scope()`).
"""

import json
import os
import sys

import kdist
import keras
import numpy as np
import tensorflow as tf

out_dir = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.normal(size=(640, 8)).astype("float32")
y = (x[:, :3].sum(1) + 0.5 * rng.normal(size=640) > 0).astype("float32")
x_val, y_val = x[:160], y[:160]
BATCH, STEPS = 32, 10


def metrics():
    return ["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
            keras.metrics.Recall(name="recall"),
            keras.metrics.AUC(name="pr_auc", curve="PR", num_thresholds=50)]


def build(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=metrics())
    return model


def dataset_fn(context):
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(640, seed=1).repeat().batch(BATCH)


def one_device(model, data):
    """What plain Keras on one device reports for the same weights and data."""
    reference = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
    reference.compile("sgd", "binary_crossentropy", metrics=metrics())
    reference.set_weights(model.get_weights())
    return reference.evaluate(*data, batch_size=BATCH, verbose=0, return_dict=True)


def compared(model, data):
    got = model.evaluate(*data, batch_size=BATCH, verbose=0, return_dict=True)
    expected = one_device(model, data)
    return {"got": got, "expected": expected,
            "largest": max(abs(got[k] - expected[k]) for k in expected)}


report = {}
with kdist.scope():  # ps and worker tasks serve here and exit when the chief is done
    first = build(1)
try:
    keras.utils.experimental.DatasetCreator(dataset_fn)
except AttributeError as error:
    dataset_creator = str(error)
first.fit(dataset_fn, epochs=3, steps_per_epoch=STEPS, validation_data=(x_val, y_val),
          verbose=0, callbacks=[keras.callbacks.EarlyStopping(monitor="val_auc", patience=5),
                                keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "m.keras"))])
report["after_fit"] = compared(first, (x, y))
report["again"] = compared(first, (x_val, y_val))
with kdist.scope():
    second = build(2)
second.fit(dataset_fn, epochs=2, steps_per_epoch=STEPS, verbose=0)
report["second_model"] = compared(second, (x, y))
report["first_model_again"] = compared(first, (x, y))
with open(os.path.join(out_dir, "chief.json"), "w") as f:
    json.dump({"evaluations": report, "dataset_creator": dataset_creator}, f, indent=1)
print("ps_metrics done", {k: v["largest"] for k, v in report.items()})
