"""ModelParallelDense against keras.layers.Dense on 1..4 logical CPU devices (one fresh process:
the CPU is split into 4 before TensorFlow starts). Prints one JSON line for
tests/test_model_parallel.py."""

import json
import os
import tempfile

import kdist

DEVICES = kdist.split_cpu(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kdist.layers import ModelParallelDense  # noqa: E402

rng = np.random.default_rng(0)
report = {"equivalence": [], "pairs": []}


def dense_twin(layer):
    twin = keras.layers.Dense(layer.units, activation=layer.activation, use_bias=layer.use_bias)
    twin.build((None, int(layer.kernel.shape[0])))
    twin.set_weights([layer.kernel.numpy()] + ([layer.bias.numpy()] if layer.use_bias else []))
    return twin


def value_and_grads(layer, x):
    x = tf.Variable(x)
    with tf.GradientTape() as tape:
        y = layer(x)
        loss = tf.reduce_sum(tf.sin(y))
    weights = [layer.kernel_shards, layer.bias_shards] if isinstance(layer, ModelParallelDense) \
        else [[layer.kernel], [layer.bias] if layer.use_bias else []]
    grads = tape.gradient(loss, [x] + weights[0] + weights[1])
    axis = 1 if getattr(layer, "partition", "column") == "column" else 0
    kernel_grad = np.concatenate([g.numpy() for g in grads[1:1 + len(weights[0])]], axis=axis)
    bias_grads = [g.numpy() for g in grads[1 + len(weights[0]):]]
    bias_grad = np.concatenate(bias_grads) if bias_grads else np.zeros(0)
    return y.numpy(), grads[0].numpy(), kernel_grad, bias_grad


# Forward and gradients (input, kernel, bias) equal Dense, for 1..4 devices, random and uneven shapes.
for count in (1, 2, 3, 4):
    for partition in ("column", "row"):
        for _ in range(3):
            features, units = int(rng.integers(count, 13)), int(rng.integers(count, 13))
            layer = ModelParallelDense(units, devices=DEVICES[:count], partition=partition,
                                       activation="tanh")
            x = rng.normal(size=(5, features)).astype("float32")
            layer(x)
            ours, theirs = value_and_grads(layer, x), value_and_grads(dense_twin(layer), x)
            report["equivalence"].append({
                "devices": count, "partition": partition, "shape": [features, units],
                "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs)),
                "shard_devices": sorted({k.value.device for k in layer.kernel_shards}),
                "shard_shapes": [list(k.shape) for k in layer.kernel_shards]})

# A column layer (gather_output=False) feeding a row layer equals two Dense layers.
for count in (2, 3, 4):
    column = ModelParallelDense(11, devices=DEVICES[:count], gather_output=False, activation="relu")
    row = ModelParallelDense(7, devices=DEVICES[:count], partition="row", input_is_split=True)
    x = rng.normal(size=(6, 9)).astype("float32")
    y = row(column(x)).numpy()
    expected = dense_twin(row)(dense_twin(column)(x)).numpy()
    report["pairs"].append(float(np.abs(y - expected).max()))

# Initialisation: with the same seed, the assembled kernel equals Dense's.
keras.utils.set_random_seed(7)
dense = keras.layers.Dense(10)
dense.build((None, 6))
keras.utils.set_random_seed(7)
split = ModelParallelDense(10, devices=DEVICES[:3])
split.build((None, 6))
report["init_equal"] = bool(np.array_equal(dense.kernel.numpy(), split.kernel.numpy()))

# Dense conversion and .keras save/load round-trip exactly; Sequential, Functional, subclassed.
converted = ModelParallelDense.from_dense(dense, devices=DEVICES[:3], partition="row")
back = converted.to_dense()
report["dense_round_trip"] = bool(np.array_equal(back.kernel.numpy(), dense.kernel.numpy())
                                  and np.array_equal(back.bias.numpy(), dense.bias.numpy()))
inputs = keras.Input((6,))
hidden = ModelParallelDense(8, devices=DEVICES[:2], gather_output=False, activation="relu")(inputs)
functional = keras.Model(inputs, ModelParallelDense(3, devices=DEVICES[:2], partition="row",
                                                    input_is_split=True)(hidden))
sequential = keras.Sequential([keras.Input((6,)), ModelParallelDense(5, devices=DEVICES[:4]),
                               keras.layers.Dense(1)])


class Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.split = ModelParallelDense(4, devices=DEVICES[:2], partition="row")

    def call(self, x):
        return self.split(x)


subclassed = Subclassed()
x = rng.normal(size=(4, 6)).astype("float32")
report["saved"] = {}
for name, model in (("functional", functional), ("sequential", sequential)):
    path = os.path.join(tempfile.mkdtemp(), f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    report["saved"][name] = bool(np.array_equal(model(x).numpy(), loaded(x).numpy()))
report["subclassed_shape"] = list(subclassed(x).shape)
report["subclassed_vs_dense"] = float(np.abs(subclassed(x).numpy()
                                             - subclassed.split.to_dense()(x).numpy()).max())

# Trains with fit.
y = (x.sum(1, keepdims=True) > 0).astype("float32")
sequential.compile(keras.optimizers.Adam(0.05), "mse")
history = sequential.fit(np.repeat(x, 16, 0), np.repeat(y, 16, 0), epochs=5, verbose=0).history
report["fit_loss"] = history["loss"]

# Clear errors.
errors = {}
for name, make in {"missing_device": lambda: ModelParallelDense(4, devices=["/cpu:9"]),
                   "bad_partition": lambda: ModelParallelDense(4, devices=DEVICES, partition="x"),
                   "too_many_devices": lambda: ModelParallelDense(2, devices=DEVICES)}.items():
    try:
        make()
        errors[name] = "no error"
    except ValueError as err:
        errors[name] = str(err)
report["errors"] = errors
print(json.dumps(report))
