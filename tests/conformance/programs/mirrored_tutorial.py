"""A Keras user's MirroredStrategy script, the way the "distributed training with Keras" tutorial
goes (dataset, callbacks with a learning-rate schedule, checkpoint, restore the latest, evaluate,
save and load), with the two kdist lines plus `kdist.split_cpu(2)` (CPU-only machines: two
logical devices; with GPUs, leave it out). Prints one JSON report.

    python mirrored_tutorial.py OUT
"""

import json
import os
import sys

import kdist  # kdist line 1

devices = kdist.split_cpu(2)  # before TensorFlow starts (this machine has no GPU)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

out_dir = sys.argv[1]
rng = np.random.default_rng(0)
images = rng.integers(0, 255, size=(512, 8, 8, 1)).astype("uint8")
labels = (images.reshape(512, -1).mean(1) > 127).astype("int64")

with kdist.scope() as strategy:  # kdist line 2 (sees the two devices: MirroredStrategy)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam(), metrics=["accuracy"])

BATCH = 32 * strategy.num_replicas_in_sync


def scale(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


train = tf.data.Dataset.from_tensor_slices((images, labels)).map(scale).cache().shuffle(512) \
    .batch(BATCH)
checkpoint_prefix = os.path.join(out_dir, "training_checkpoints", "ckpt_{epoch}.weights.h5")


def decay(epoch):
    return 1e-3 if epoch < 2 else 1e-4


seen_rates = []


class RecordLR(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        seen_rates.append(float(self.model.optimizer.learning_rate.numpy()))


history = model.fit(train, epochs=3, verbose=0, callbacks=[
    keras.callbacks.TensorBoard(log_dir=os.path.join(out_dir, "logs")),
    keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    keras.callbacks.LearningRateScheduler(decay), RecordLR()])
model.load_weights(checkpoint_prefix.format(epoch=3))
evaluation = model.evaluate(train.unbatch().batch(64), return_dict=True, verbose=0)
path = os.path.join(out_dir, "model.keras")
model.save(path)
unreplicated = keras.saving.load_model(path)  # loaded without a strategy
with kdist.scope():
    replicated = keras.saving.load_model(path)
probe = images[:16].astype("float32") / 255.0
print(json.dumps({
    "strategy": type(strategy).__name__, "replicas": strategy.num_replicas_in_sync,
    "loss": history.history["loss"], "rates": seen_rates, "evaluation": evaluation,
    "checkpoints": sorted(os.listdir(os.path.dirname(checkpoint_prefix))),
    "loaded_max_diff": float(np.abs(unreplicated.predict(probe, verbose=0)
                                    - replicated.predict(probe, verbose=0)).max()),
    "loaded_weights_max_diff": max(float(np.abs(a - b).max()) for a, b in
                                   zip(unreplicated.get_weights(), replicated.get_weights())),
    "replicated_variable": type(replicated.layers[0].kernel.value).__name__}))
