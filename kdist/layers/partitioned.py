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

from kdist.layers.sharding import DenseOptions, add_shards, split_sizes
from kdist.strategies import cluster_of


def _default_shards() -> int:
    """The ps tasks of the current strategy's cluster, else 1."""
    import tensorflow as tf

    spec = cluster_of(tf.distribute.get_strategy())
    return max(1, spec.roles.get("ps", 1)) if spec is not None else 1



@keras.saving.register_keras_serializable(package="kdist")
class PartitionedDense(DenseOptions, keras.layers.Layer):
    """`keras.layers.Dense` with its kernel split by output units into `num_shards` variables.

    Args:
        units: output size.
        num_shards: kernel shards (default: the number of ps tasks of the current strategy, else 1).

    The other arguments (activation, use_bias, kernel_initializer, bias_initializer,
    kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint) are as for
    `keras.layers.Dense`.
    """

    def __init__(self, units, num_shards=None, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, kernel_constraint=None,
                 bias_constraint=None, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.num_shards = num_shards or _default_shards()
        split_sizes(units, self.num_shards)  # validates early
        self.set_dense_options(activation, use_bias, kernel_initializer, bias_initializer,
                          kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint)

    def build(self, input_shape):
        self.kernel_shards = add_shards(self, "kernel", (input_shape[-1], self.units), 1,
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
                **self.dense_options_config()}


@keras.saving.register_keras_serializable(package="kdist")
class PartitionedEmbedding(keras.layers.Layer):
    """`keras.layers.Embedding` with its table split by rows into `num_shards` variables.

    Lookups gather from each shard where it lives (`tf.nn.embedding_lookup`'s "div" strategy), so
    a step moves only the rows it uses.

    Args:
        input_dim: vocabulary size.
        output_dim: embedding size.
        num_shards: table shards (default: the number of ps tasks in TF_CONFIG, else 1).

    The other arguments (embeddings_initializer, embeddings_regularizer, embeddings_constraint)
    are as for `keras.layers.Embedding`.
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
        self.embedding_shards = add_shards(
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
