"""Custom loops over model-parallel layers, as users write them, against the plain Keras layers:
a persistent GradientTape asked for several gradients, a tape inside a tape (second order, a
gradient penalty), and a Jacobian. ModelParallelDense (column and row) and ModelParallelEmbedding
(row and column), on 1 to 4 logical CPUs with uneven splits. Prints one JSON line for
tests/test_model_parallel.py."""

import json

import kdist

DEVICES = kdist.split_cpu(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(3)
X = tf.constant(rng.normal(size=(5, 7)).astype("float32"))  # 7 features, 5 units: uneven splits
IDS = tf.constant(rng.integers(0, 11, size=(5, 3)).astype("int32"))  # 11 rows, 6 dimensions


def dense_pair(devices, partition):
    split = kdist.layers.ModelParallelDense(5, devices=devices, partition=partition,
                                            activation="tanh")
    split.build((None, 7))
    return split, split.to_dense(), X


def embedding_pair(devices, partition):
    plain = keras.layers.Embedding(11, 6)
    plain.build()
    return kdist.layers.ModelParallelEmbedding.from_embedding(plain, devices, partition), plain, IDS


def full(layer, grads):
    """The gradients of `layer`'s variables, assembled like the plain layer's (kernel, bias)."""
    if isinstance(layer, kdist.layers.ModelParallelDense):
        axis = 1 if layer.partition == "column" else 0
        kernels = grads[:len(layer.kernel_shards)]
        biases = grads[len(layer.kernel_shards):]
        return [np.concatenate(kernels, axis=axis), np.concatenate(biases, axis=0)]
    if isinstance(layer, kdist.layers.ModelParallelEmbedding):
        return [np.concatenate(grads, axis=0 if layer.partition == "row" else 1)]
    return list(grads)


def dense(gradient):
    return tf.convert_to_tensor(gradient).numpy()  # an embedding's IndexedSlices too


def loss_of(layer, inputs):
    return tf.reduce_sum(tf.sin(layer(inputs)) * tf.range(1.0, 1.0 + layer(inputs).shape[-1]))


def persistent(layer, inputs):
    """One persistent tape, two gradients: the output's (the input's for Dense), then the
    variables'."""
    with tf.GradientTape(persistent=True) as tape:
        if inputs.dtype.is_floating:
            tape.watch(inputs)
        outputs = layer(inputs)
        loss = tf.reduce_sum(tf.sin(outputs) * tf.range(1.0, 1.0 + outputs.shape[-1]))
    first = dense(tape.gradient(loss, inputs if inputs.dtype.is_floating else outputs))
    second = full(layer, [dense(g) for g in tape.gradient(loss, layer.trainable_variables)])
    return [first, *second]


def second_order(layer, inputs):
    """A gradient penalty: the variables' gradient of the squared norm of the first gradient."""
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            if inputs.dtype.is_floating:
                inner.watch(inputs)
                loss = loss_of(layer, inputs)
                target = inputs
            else:
                loss = loss_of(layer, inputs)
                target = layer.trainable_variables
        first = inner.gradient(loss, target)
        penalty = tf.add_n([tf.reduce_sum(tf.square(tf.convert_to_tensor(g)))
                            for g in tf.nest.flatten(first)])
    return full(layer, [dense(g) for g in outer.gradient(penalty, layer.trainable_variables)])


def jacobian(layer, inputs):
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        outputs = layer(inputs)
    return [tape.jacobian(outputs, inputs).numpy(),
            tape.jacobian(outputs, inputs, experimental_use_pfor=False).numpy()]


def difference(a, b) -> float:
    """The largest difference relative to the largest plain value (0 would hide a gradient
    that is missing on both sides: the scale must be positive)."""
    scale = max(float(np.abs(np.asarray(v)).max()) for v in b)
    assert scale > 0 and len(a) == len(b), (scale, len(a), len(b))
    return max(float(np.abs(np.asarray(u) - np.asarray(v)).max()) for u, v in zip(a, b)) / scale


report = {"cases": []}
for make, kind in ((dense_pair, "dense"), (embedding_pair, "embedding")):
    for count in (1, 2, 3, 4):
        for partition in ("column", "row"):
            split, plain, inputs = make(DEVICES[:count], partition)
            case = {"layer": kind, "devices": count, "partition": partition}
            checks = [("persistent", persistent), ("second_order", second_order)]
            if kind == "dense":
                checks.append(("jacobian", jacobian))
            for name, check in checks:
                try:
                    case[name] = difference(check(split, inputs), check(plain, inputs))
                except Exception as err:  # noqa: BLE001 (the failure, for the test to show)
                    case[name] = f"{type(err).__name__}: {str(err)[:200]}"
            report["cases"].append(case)
print(json.dumps(report))
