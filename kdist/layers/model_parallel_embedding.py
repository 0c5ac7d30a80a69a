"""`ModelParallelEmbedding`: an embedding table split across devices.

- ``partition="row"``: the vocabulary is split; device i holds rows [start_i, end_i) and looks up
  the ids that fall there (zeros for the others); the partial results are summed
  (`reduce_from_devices`), so each id's vector comes from the one device that holds it.
- ``partition="column"``: the embedding dimensions are split; every device looks up every id in
  its columns and the slices are concatenated (`gather_from_devices`).

The whole table is initialised first and then split, so with the same seed it equals what
`keras.layers.Embedding` initialises; `from_embedding` splits a built Embedding keeping its table.

>>> import kdist, numpy as np
>>> layer = kdist.layers.ModelParallelEmbedding(10, 4, devices=["/cpu:0", "/cpu:0"])
>>> tuple(layer(np.array([[1, 9]])).shape), [tuple(t.shape) for t in layer.embeddings_shards]
((1, 2, 4), [(5, 4), (5, 4)])
"""

from __future__ import annotations

import functools

import keras
from keras import ops

from kdist.layers import mappings
from kdist.layers.model_parallel import PARTITIONS, default_devices
from kdist.layers.sharding import add_shards, pieces_like, split_sizes
from kdist.devices import local_devices

_OPTIONS = ("embeddings_initializer", "embeddings_regularizer", "embeddings_constraint")


@keras.saving.register_keras_serializable(package="kdist")
class ModelParallelEmbedding(keras.layers.Layer):
    """Embedding split over `devices` by vocabulary rows ("row") or embedding dimensions ("column").

    Args:
        input_dim: vocabulary size.
        output_dim: embedding size.
        devices: device names (default: local GPUs, else the logical CPU devices; at least two).
        partition: "row" or "column".

    The other arguments (embeddings_initializer, embeddings_regularizer, embeddings_constraint,
    mask_zero) are as for `keras.layers.Embedding`.
    """

    def __init__(self, input_dim, output_dim, devices=None, partition="row",
                 embeddings_initializer="uniform", embeddings_regularizer=None,
                 embeddings_constraint=None, mask_zero=False, **kwargs):
        super().__init__(**kwargs)
        if partition not in PARTITIONS:
            raise ValueError(f"partition={partition!r}: use 'row' (vocabulary) or 'column' "
                             "(embedding dimensions)")

        self.devices = list(local_devices(devices)) if devices else default_devices()
        self.input_dim, self.output_dim, self.partition = input_dim, output_dim, partition
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.embeddings_constraint = keras.constraints.get(embeddings_constraint)
        self.mask_zero = mask_zero
        split_sizes(input_dim if partition == "row" else output_dim, len(self.devices), "devices")

    def build(self, input_shape=None):
        self.embeddings_shards = add_shards(
            self, "embeddings", (self.input_dim, self.output_dim),
            0 if self.partition == "row" else 1, self.embeddings_initializer,
            self.embeddings_regularizer, self.embeddings_constraint, len(self.devices),
            self.devices)

    def call(self, inputs):
        ids = ops.cast(inputs, "int32")
        copies = mappings.copy_to_devices(ids, self.devices)
        if self.partition == "column":
            slices = [mappings.compute_on(device, functools.partial(self._lookup, i), local)
                      for i, (device, local) in enumerate(zip(self.devices, copies))]
            return mappings.gather_from_devices(slices, self.devices[0])
        partials = [mappings.compute_on(device, functools.partial(self._rows_held, i), local)
                    for i, (device, local) in enumerate(zip(self.devices, copies))]
        return mappings.reduce_from_devices(partials, self.devices[0])

    def _lookup(self, i, ids):
        import tensorflow as tf

        return tf.gather(self.embeddings_shards[i], ids)

    def _rows_held(self, i, ids):
        """Shard i's rows for the ids it holds, zeros for the others."""
        import tensorflow as tf

        start = sum(int(table.shape[0]) for table in self.embeddings_shards[:i])
        rows = int(self.embeddings_shards[i].shape[0])
        here = tf.logical_and(ids >= start, ids < start + rows)
        found = tf.gather(self.embeddings_shards[i], tf.clip_by_value(ids - start, 0, rows - 1))
        return found * tf.cast(here, found.dtype)[..., None]

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0) if self.mask_zero else None

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    @property
    def embeddings(self):
        return ops.concatenate(self.embeddings_shards, axis=0 if self.partition == "row" else 1)

    @classmethod
    def from_embedding(cls, layer: keras.layers.Embedding, devices=None, partition="row"):
        """Splits a built `keras.layers.Embedding` over `devices`, keeping its table."""
        if not layer.built:
            raise ValueError(f"{layer.name} is not built: call it on data (or build it) first")
        config = {k: v for k, v in layer.get_config().items()
                  if k in ("name", "input_dim", "output_dim", "mask_zero", "dtype", "trainable",
                           *_OPTIONS)}
        split = cls.from_config({**config, "devices": devices, "partition": partition})
        split.build()
        split.set_weights(pieces_like(ops.convert_to_numpy(layer.embeddings),
                                      split.embeddings_shards, 0 if partition == "row" else 1))
        return split

    def get_config(self):
        return {**super().get_config(), "input_dim": self.input_dim,
                "output_dim": self.output_dim, "devices": self.devices,
                "partition": self.partition, "mask_zero": self.mask_zero,
                **{name: keras.saving.serialize_keras_object(getattr(self, name))
                   for name in _OPTIONS}}
