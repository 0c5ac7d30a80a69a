"""Helpers shared by the layers that split a variable into shards (`Partitioned*` over ps tasks,
`ModelParallelDense` over devices): sizes, the Dense options they share, and the split itself.

>>> from kdist.layers.sharding import split_sizes
>>> split_sizes(10, 3)
[4, 3, 3]
"""

from __future__ import annotations

import keras
from keras import ops

from kdist.keras_seam import patches
from kdist.layers import placement


def split_sizes(total: int, parts: int, what: str = "num_shards") -> list[int]:
    """`total` split into `parts` sizes differing by at most one, larger first (TF's "div" rule)."""
    if parts < 1 or parts > total:
        raise ValueError(f"{what}={parts}: use 1 to {total} (each part holds at least one "
                         "unit/row)")
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


_DENSE_OPTIONS = ("kernel_initializer", "bias_initializer", "kernel_regularizer",
                  "bias_regularizer", "kernel_constraint", "bias_constraint")
_GETTERS = ("initializers", "initializers", "regularizers", "regularizers", "constraints",
            "constraints")


class DenseOptions:
    """A mixin for Dense-like layers: the options they share with `keras.layers.Dense`."""

    def set_dense_options(self, activation, use_bias, kernel_initializer, bias_initializer,
                          kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint):
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        values = (kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
                  kernel_constraint, bias_constraint)
        for name, module, value in zip(_DENSE_OPTIONS, _GETTERS, values):
            setattr(self, name, getattr(keras, module).get(value))

    def dense_options_config(self) -> dict:
        """The `get_config()` entries of `set_dense_options`."""
        return {"activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                **{name: keras.saving.serialize_keras_object(getattr(self, name))
                   for name in _DENSE_OPTIONS}}


def add_shards(layer, name, full_shape, axis, initializer, regularizer, constraint, num_shards,
                devices=None):
    """Initialises the whole variable once, then adds it as `num_shards` variables split on `axis`
    (shard i created on `devices[i]` when devices are given)."""
    import contextlib

    import tensorflow as tf

    if devices:
        patches.ensure()  # its slots_next_to_variables hook: slots on the shards' devices
    initializer = keras.initializers.get(initializer)
    with tf.init_scope():  # eager even when the layer is built while a model is being traced
        full = initializer(full_shape, dtype=layer.variable_dtype)
    shards, start = [], 0
    for i, size in enumerate(split_sizes(full_shape[axis], num_shards)):
        with tf.init_scope():
            piece = ops.slice(full, [start if a == axis else 0 for a in range(len(full_shape))],
                              [size if a == axis else d for a, d in enumerate(full_shape)])
        with placement.on_device(devices[i]) if devices else contextlib.nullcontext():
            shards.append(layer.add_weight(
                name=f"{name}_shard_{i}", shape=tuple(piece.shape),
                initializer=lambda shape, dtype=None, value=piece: ops.cast(value, dtype),
                regularizer=regularizer, constraint=constraint))
        start += size
    return shards


def pieces_like(full, shards, axis: int) -> list:
    """`full` (a NumPy array) cut along `axis` into pieces the sizes of `shards` (variables)."""
    pieces, start = [], 0
    for shard in shards:
        size = int(shard.shape[axis])
        pieces.append(full[start:start + size] if axis == 0 else full[:, start:start + size])
        start += size
    return pieces
