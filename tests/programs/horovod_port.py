"""A Horovod user's Keras program, ported to kdist by docs/migration.md: each Horovod line is kept
as a comment above what replaces it. tests/test_migration.py runs it on 2 workers (both workers'
History must be equal, as Horovod's MetricAverageCallback made them) and through `kdist verify`
against one device (the warm-up's learning rate, scaled for the replicas, included).

    kdist launch --workers 2 -- python horovod_port.py OUT      writes OUT/<task>.json
"""

import json
import os
import sys

import kdist
import keras
import numpy as np
import tensorflow as tf

out = sys.argv[1]
# import horovod.tensorflow.keras as hvd
# hvd.init()
spec = kdist.cluster()  # hvd.rank() == 0: spec.is_chief; hvd.size(): spec.num_workers
mnist = np.load(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "data",
                             "mnist_offline.npz"))
x = (mnist["x_train"][:2048].reshape(-1, 784) / 255).astype("float32")
y = mnist["y_train"][:2048].astype("int32")

# dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank())
# dataset = dataset.shuffle(2048).batch(64)                       (64 per process)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048)
dataset = dataset.batch(kdist.global_batch_size(64))  # the global batch: 64 per replica
steps_per_epoch = len(x) // kdist.global_batch_size(64)

with kdist.scope():
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    # opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    # hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.001 * hvd.size(), warmup_epochs=1)
    learning_rate = kdist.LinearWarmup(kdist.scale_learning_rate(0.001),
                                       warmup_steps=1 * steps_per_epoch)
    # model.compile(..., experimental_run_tf_function=False)        (Keras 3 refuses it)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

# callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
#              hvd.callbacks.MetricAverageCallback(), <the warm-up above>]
# if hvd.rank() == 0: callbacks.append(keras.callbacks.ModelCheckpoint(...))
callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(out, "checkpoint-{epoch}.keras"))]
# model.fit(dataset, steps_per_epoch=500 // hvd.size(), ...)       (Keras counts the batches)
history = model.fit(dataset, epochs=2, callbacks=callbacks, verbose=0)
with open(os.path.join(out, f"{spec.task_type}{spec.task_index}.json"), "w") as f:
    json.dump(history.history, f)
