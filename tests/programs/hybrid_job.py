"""Data parallel across 2 MultiWorkerMirrored workers x model parallel over each worker's 2 logical
CPUs, the storage split; run by tests/test_model_parallel.py under `kdist launch --workers 2`.

The model is written the way a Keras user writes it (Dense layers, a `tf.data.Dataset` of global
batches, stock `keras.callbacks.BackupAndRestore`) and split by a Keras `LayoutMap`. Worker 0 also
trains plain Keras on one device from the same weights with the same global batches. Each worker
writes OUT/<task>.json: weights, where every variable lives, the collective groups used, the
checkpoint and BackupAndRestore results, and a 1-device-per-worker run (plain data parallel).
"""

import json
import os
import sys

import kdist

out_dir = sys.argv[1]
devices = kdist.split_cpu(2)
strategy = kdist.strategy(devices=["/cpu:0"])  # one replica per worker; on GPUs ["/gpu:0"]

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kdist.layers import placement  # noqa: E402

spec = kdist.cluster()
GLOBAL_BATCH, EPOCHS = 16, 3
rng = np.random.default_rng(0)  # the same data on every worker
x = rng.normal(size=(160, 12)).astype("float32")
y = (x[:, :6].sum(1) > 0).astype("int32")


def dataset():
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def plain_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu", name="up"),
                             keras.layers.Dense(16, activation="relu", name="down"),
                             keras.layers.Dense(2, name="head")])


def compiled(model):
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def hybrid_model(model_devices):
    """Inside kdist.scope(): Keras's LayoutMap splits `up` by columns and `down` by rows."""
    mesh = keras.distribution.DeviceMesh((1, len(model_devices)), ["batch", "model"], model_devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*up/kernel"], layout_map[".*down/kernel"] = (None, "model"), ("model", None)
    with kdist.scope():
        return compiled(kdist.layers.from_layout_map(plain_model(), layout_map))


def assembled(model):
    """The model's whole weights, in plain Keras's order (shards concatenated)."""
    weights = []
    for layer in model.layers:
        if isinstance(layer, kdist.layers.ModelParallelDense):
            weights += [layer.kernel.numpy(), layer.bias.numpy()]
        else:
            weights += [w.numpy() for w in layer.weights]
    return weights


def local(device):
    return device.rsplit("/", 1)[-1]  # "/job:worker/replica:0/task:1/device:CPU:1" -> "device:CPU:1"


def bytes_per_device(variables):
    per_device = {}
    for variable in variables:
        for value in getattr(variable.value, "values", [variable.value]):
            size = int(np.prod(value.shape)) * value.dtype.size
            per_device[local(value.device)] = per_device.get(local(value.device), 0) + size
    return per_device


class StopAfterEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt("interrupted on purpose")


report = {"replicas": strategy.num_replicas_in_sync}

# 1. Train; equal to plain Keras on one device with the global batch.
model = hybrid_model(devices)
initial = assembled(model)
history = model.fit(dataset(), epochs=EPOCHS, verbose=0)
trained = assembled(model)
report.update(
    layers=[type(layer).__name__ for layer in model.layers], loss=history.history["loss"],
    training_change=max(float(np.abs(a - b).max()) for a, b in zip(trained, initial)),
    weights=[w.tolist() for w in trained],
    variable_types=sorted({type(w.value).__name__ for w in model.weights}),
    shard_devices={w.path: local(w.value.device) for w in model.weights},
    model_bytes=bytes_per_device(model.weights),
    optimizer_bytes=bytes_per_device(model.optimizer.variables),
    split_kernel_bytes=[4 * 12 * 32, 4 * 32 * 16],
    own_groups=[local(d) for d in placement.own_groups(strategy)])
if spec.task_index == 0:
    reference = compiled(plain_model())
    reference.set_weights(initial)
    reference_history = reference.fit(dataset(), epochs=EPOCHS, verbose=0)
    report.update(max_weight_diff=max(float(np.abs(a - b).max()) for a, b in
                                      zip(trained, reference.get_weights())),
                  reference_loss=reference_history.history["loss"])

# 2. Checkpoint: each worker saves its own file; a new hybrid model loads it.
path = os.path.join(out_dir, f"hybrid-{spec.task_index}.weights.h5")
model.save_weights(path)
restored = hybrid_model(devices)
restored.load_weights(path)
report["restored_diff"] = max(float(np.abs(a - b).max()) for a, b in
                              zip(assembled(restored), trained))
report["restored_output_diff"] = float(np.abs(restored.predict(x, verbose=0) -
                                              model.predict(x, verbose=0)).max())

# 3. Stock BackupAndRestore: interrupted after epoch 1, resumed by a new process's fit (here a
#    new model), ends with the uninterrupted run's weights.
backup = os.path.join(out_dir, "backup")
interrupted = hybrid_model(devices)
try:
    interrupted.fit(dataset(), epochs=EPOCHS, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(backup), StopAfterEpoch(1)])
except KeyboardInterrupt:
    pass
resumed = hybrid_model(devices)
resumed_history = resumed.fit(dataset(), epochs=EPOCHS, verbose=0,
                              callbacks=[keras.callbacks.BackupAndRestore(backup)])
report["resumed_epochs"] = len(resumed_history.history["loss"])
report["resumed_diff"] = max(float(np.abs(a - b).max()) for a, b in
                             zip(assembled(resumed), trained))

# 4. One device per worker: the same map over one device is plain data parallelism.
groups_before = placement.own_groups(strategy)
single = hybrid_model(devices[:1])
single.set_weights(initial)
single.fit(dataset(), epochs=EPOCHS, verbose=0)
report["single_device_diff"] = max(float(np.abs(a - b).max()) for a, b in
                                   zip(assembled(single), trained))
report["single_device_placements"] = sorted({local(w.value.device) for w in single.weights})
report["single_device_new_groups"] = placement.own_groups(strategy) != groups_before

with open(os.path.join(out_dir, f"{spec.task}.json"), "w") as f:
    json.dump(report, f)
