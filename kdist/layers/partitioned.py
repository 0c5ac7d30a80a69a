"""Dense and Embedding layers whose large variable is split into shards, one per parameter server.

Keras 3 cannot train the `ShardedVariable`s that TensorFlow's `variable_partitioner` creates. These
layers split the variable themselves into ordinary Keras variables; ParameterServerStrategy places
consecutive variables on consecutive ps tasks, so `num_shards` shards land on `num_shards` different
ps (when there are at least that many). The whole variable is initialised first and then split, so
with the same seed it equals what `keras.layers.Dense` / `Embedding` would initialise. Outside
ParameterServerStrategy they behave like the plain layers.

>>> import kdist, keras, numpy as np
>>> layer = kdist.layers.PartitionedDense(10, num_shards=3)
>>> layer(np.ones((2, 4), "float32")).shape
TensorShape([2, 10])
>>> [tuple(k.shape) for k in layer.kernel_shards]
[(4, 4), (4, 3), (4, 3)]
"""

from __future__ import annotations

import keras
from keras import ops


def split_sizes(total: int, parts: int, what: str = "num_shards") -> list[int]:
    """`total` split into `parts` sizes differing by at most one, larger first (TF's "div" rule)."""
    if parts < 1 or parts > total:
        raise ValueError(f"{what}={parts}: use 1 to {total} (each part holds at least one "
                         "unit/row)")
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


_DENSE_OPTIONS = ("kernel_initializer", "bias_initializer", "kernel_regularizer",
                  "bias_regularizer", "kernel_constraint", "bias_constraint")


def set_dense_options(layer, activation, use_bias, kernel_initializer, bias_initializer,
                      kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint):
    """Sets the options a Dense-like layer shares with `keras.layers.Dense`."""
    layer.activation = keras.activations.get(activation)
    layer.use_bias = use_bias
    getters = (keras.initializers.get, keras.initializers.get, keras.regularizers.get,
               keras.regularizers.get, keras.constraints.get, keras.constraints.get)
    values = (kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
              kernel_constraint, bias_constraint)
    for name, get, value in zip(_DENSE_OPTIONS, getters, values):
        setattr(layer, name, get(value))


def dense_options_config(layer) -> dict:
    """The `get_config()` entries of `set_dense_options`."""
    return {"activation": keras.activations.serialize(layer.activation), "use_bias": layer.use_bias,
            **{name: keras.saving.serialize_keras_object(getattr(layer, name))
               for name in _DENSE_OPTIONS}}


def _default_shards() -> int:
    from kdist.cluster import cluster

    return max(1, cluster().roles.get("ps", 1))


def _add_shards(layer, name, full_shape, axis, initializer, regularizer, constraint, num_shards,
                devices=None):
    """Initialises the whole variable once, then adds it as `num_shards` variables split on `axis`
    (shard i created on `devices[i]` when devices are given)."""
    import contextlib

    import tensorflow as tf

    initializer = keras.initializers.get(initializer)
    with tf.init_scope():  # eager even when the layer is built while a model is being traced
        full = initializer(full_shape, dtype=layer.variable_dtype)
    shards, start = [], 0
    for i, size in enumerate(split_sizes(full_shape[axis], num_shards)):
        with tf.init_scope():
            piece = ops.slice(full, [start if a == axis else 0 for a in range(len(full_shape))],
                              [size if a == axis else d for a, d in enumerate(full_shape)])
        with tf.device(devices[i]) if devices else contextlib.nullcontext():
            shards.append(layer.add_weight(
                name=f"{name}_shard_{i}", shape=tuple(piece.shape),
                initializer=lambda shape, dtype=None, value=piece: ops.cast(value, dtype),
                regularizer=regularizer, constraint=constraint))
        start += size
    return shards


@keras.saving.register_keras_serializable(package="kdist")
class PartitionedDense(keras.layers.Layer):
    """`keras.layers.Dense` with its kernel split by output units into `num_shards` variables.

    Args:
        units: output size.
        num_shards: kernel shards (default: the number of ps tasks in TF_CONFIG, else 1).
        activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, kernel_constraint, bias_constraint: as for `keras.layers.Dense`.
    """

    def __init__(self, units, num_shards=None, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, kernel_constraint=None,
                 bias_constraint=None, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.num_shards = num_shards or _default_shards()
        split_sizes(units, self.num_shards)  # validates early
        set_dense_options(self, activation, use_bias, kernel_initializer, bias_initializer,
                          kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint)

    def build(self, input_shape):
        self.kernel_shards = _add_shards(self, "kernel", (input_shape[-1], self.units), 1,
                                         self.kernel_initializer, self.kernel_regularizer,
                                         self.kernel_constraint, self.num_shards)
        self.bias = self.add_weight(
            name="bias", shape=(self.units,), initializer=self.bias_initializer,
            regularizer=self.bias_regularizer, constraint=self.bias_constraint) \
            if self.use_bias else None

    @property
    def kernel(self):
        """The whole kernel, assembled from its shards."""
        return ops.concatenate(self.kernel_shards, axis=1)

    def call(self, inputs):
        outputs = ops.concatenate([ops.matmul(inputs, shard) for shard in self.kernel_shards],
                                  axis=-1)
        if self.bias is not None:
            outputs = outputs + self.bias
        return self.activation(outputs)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "num_shards": self.num_shards,
                **dense_options_config(self)}


@keras.saving.register_keras_serializable(package="kdist")
class PartitionedEmbedding(keras.layers.Layer):
    """`keras.layers.Embedding` with its table split by rows into `num_shards` variables.

    Lookups gather from each shard where it lives (`tf.nn.embedding_lookup`'s "div" strategy), so
    a step moves only the rows it uses.

    Args:
        input_dim: vocabulary size. output_dim: embedding size.
        num_shards: table shards (default: the number of ps tasks in TF_CONFIG, else 1).
        embeddings_initializer, embeddings_regularizer, embeddings_constraint: as for Embedding.
    """

    def __init__(self, input_dim, output_dim, num_shards=None, embeddings_initializer="uniform",
                 embeddings_regularizer=None, embeddings_constraint=None, **kwargs):
        super().__init__(**kwargs)
        self.input_dim, self.output_dim = input_dim, output_dim
        self.num_shards = num_shards or _default_shards()
        split_sizes(input_dim, self.num_shards)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.embeddings_constraint = keras.constraints.get(embeddings_constraint)

    def build(self, input_shape=None):
        self.embedding_shards = _add_shards(
            self, "embeddings", (self.input_dim, self.output_dim), 0, self.embeddings_initializer,
            self.embeddings_regularizer, self.embeddings_constraint, self.num_shards)

    def call(self, inputs):
        import tensorflow as tf

        ids = ops.cast(inputs, "int32")
        return tf.nn.embedding_lookup([shard.value for shard in self.embedding_shards], ids)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def get_config(self):
        return {**super().get_config(), "input_dim": self.input_dim, "output_dim": self.output_dim,
                "num_shards": self.num_shards,
                **{name: keras.saving.serialize_keras_object(getattr(self, name)) for name in (
                    "embeddings_initializer", "embeddings_regularizer", "embeddings_constraint")}}
