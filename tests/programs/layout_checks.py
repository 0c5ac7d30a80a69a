"""`kdist.layers.from_layout_map`: Keras 3's DeviceMesh + LayoutMap carried out on TensorFlow, on 2
logical CPUs. Run by tests/test_model_parallel.py; prints one JSON line.

Each case converts a plain Keras model the way a Keras user describes model parallelism, and
compares it with the unconverted model: outputs, and weights after `fit` from the same weights.
"""

import json
import os
import tempfile

import kdist

kdist.split_cpu(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

DEVICES = ["/cpu:0", "/cpu:1"]
mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], DEVICES)
rng = np.random.default_rng(0)


def layout(**patterns):
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, axes in patterns.items():
        layout_map[f".*{pattern}"] = axes
    return layout_map


def mlp_block():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu",
                                                                    name="up"),
                             keras.layers.Dense(16, name="down"), keras.layers.Dense(3, name="head")])


def feed_forward_block():
    """A Transformer block's feed-forward half: LayerNorm, Dense 4d, GELU, Dense d, residual."""
    keras.utils.set_random_seed(2)
    tokens = keras.Input((5, 16))
    hidden = keras.layers.LayerNormalization(name="norm")(tokens)
    hidden = keras.layers.Dense(64, activation="gelu", name="ffn_in")(hidden)
    hidden = keras.layers.Dense(16, name="ffn_out")(hidden)
    outputs = keras.layers.Add()([tokens, hidden])
    return keras.Model(tokens, keras.layers.Dense(3, name="head")(
        keras.layers.GlobalAveragePooling1D()(outputs)))


def embedding_block():
    """Token ids -> Embedding -> mean over the sequence -> Dense head."""
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,), dtype="int32"),
                             keras.layers.Embedding(50, 16, name="table"),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3, name="head")])


def case(build, layout_map, x):
    original = build()
    split = kdist.layers.from_layout_map(original, layout_map)
    report = {"layers": [type(layer).__name__ for layer in split.layers],
              "output_diff": float(np.abs(split(x) - original(x)).max())}
    per_device = {}
    for layer in split.layers:
        shards = getattr(layer, "kernel_shards", None) or getattr(layer, "embeddings_shards", None)
        for variable in shards or []:
            device = variable.value.device.rsplit("CPU:", 1)[1]
            per_device[device] = per_device.get(device, 0) + variable.numpy().nbytes
        if shards:
            report.setdefault("kernel_bytes", []).append(sum(v.numpy().nbytes for v in shards))
    report["kernel_bytes_per_device"] = per_device
    y = rng.integers(0, 3, len(x))
    for model in (original, split):
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [np.array(w) for w in original.get_weights()]
    original.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    split.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    report["training_change"] = max(float(np.abs(a - b).max())
                                    for a, b in zip(before, original.get_weights()))
    report["trained_output_diff"] = float(np.abs(split(x) - original(x)).max())
    slots = {}  # the momentum slots of the split kernels and tables, by device
    for variable in split.optimizer.variables:
        if "_shard_" in variable.path and "bias" not in variable.path:
            device = variable.value.device.rsplit("CPU:", 1)[1]
            slots[device] = slots.get(device, 0) + variable.numpy().nbytes
    report["slot_bytes_per_device"] = slots
    path = os.path.join(tempfile.mkdtemp(), "split.keras")
    split.save(path)
    report["reloaded_output_diff"] = float(np.abs(keras.models.load_model(path)(x) - split(x)).max())
    return report


def refusal(build, layout_map):
    try:
        kdist.layers.from_layout_map(build(), layout_map)
    except ValueError as error:
        return str(error)
    return None


report = {
    "mlp": case(mlp_block, layout(**{"up/kernel": (None, "model"), "up/bias": ("model",),
                                     "down/kernel": ("model", None)}),
                rng.normal(size=(32, 16)).astype("float32")),
    "feed_forward": case(feed_forward_block,
                         layout(**{"ffn_in/kernel": (None, "model"),
                                   "ffn_out/kernel": ("model", None)}),
                         rng.normal(size=(32, 5, 16)).astype("float32")),
    "embedding_rows": case(embedding_block, layout(**{"table/embeddings": ("model", None)}),
                           rng.integers(0, 50, size=(32, 6)).astype("int32")),
    "embedding_columns": case(embedding_block, layout(**{"table/embeddings": (None, "model")}),
                              rng.integers(0, 50, size=(32, 6)).astype("int32")),
    "refused": {
        "conv": refusal(lambda: keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(
            4, 3, name="conv")]), layout(**{"conv/kernel": (None, None, None, "model")})),
        "norm": refusal(feed_forward_block, layout(**{"norm/gamma": ("model",)})),
        "row_bias_split": refusal(mlp_block, layout(**{"down/kernel": ("model", None),
                                                       "down/bias": ("model",)})),
    },
}
bad_mesh = keras.distribution.LayoutMap(keras.distribution.DeviceMesh((2, 2), ["batch", "model"],
                                                                      DEVICES * 2))
bad_mesh[".*up/kernel"] = (None, "model")
report["refused"]["batch_axis"] = refusal(mlp_block, bad_mesh)
print(json.dumps(report))
