"""A tf.keras 2 + tf.distribute program (TensorFlow's multi-worker tutorial's shape), ported to
Keras 3 and kdist by docs/migration.md: each old line is kept as a comment above what replaces it.
tests/test_migration.py runs it on 2 workers and through `kdist verify` against one device.

    kdist launch --workers 2 -- python tf_keras2_port.py OUT      writes OUT/<task>.json
"""

import json
import os
import sys

import kdist
import keras  # import tensorflow as tf; tf.keras.*
import numpy as np
import tensorflow as tf

out = sys.argv[1]
# strategy = tf.distribute.MultiWorkerMirroredStrategy()
# global_batch_size = 64 * strategy.num_replicas_in_sync
global_batch_size = kdist.global_batch_size(64)
mnist = np.load(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "data",
                             "mnist_offline.npz"))
x = (mnist["x_train"][:2048] / 255).astype("float32")
y = mnist["y_train"][:2048].astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048).batch(global_batch_size)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)

# with strategy.scope():
with kdist.scope():
    # model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(28, 28)), ...])
    model = keras.Sequential([keras.Input((28, 28)), keras.layers.Reshape((28, 28, 1)),
                              keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=kdist.scale_learning_rate(0.05)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

# callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=...)], and the tutorial's
# write_filepath(...) for a checkpoint written by the chief only
callbacks = [keras.callbacks.BackupAndRestore(backup_dir=os.path.join(out, "backup")),
             keras.callbacks.ModelCheckpoint(os.path.join(out, "model.keras"))]
history = model.fit(dataset, epochs=2, callbacks=callbacks, verbose=0)
with open(os.path.join(out, f"{kdist.cluster().task_type}{kdist.cluster().task_index}.json"),
          "w") as f:
    json.dump(history.history, f)
