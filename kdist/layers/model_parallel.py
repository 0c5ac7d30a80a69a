"""`ModelParallelDense`: a Dense layer whose kernel is split across devices (Megatron-style).

- ``partition="column"``: the output units are split; device i holds kernel[:, cols_i] and
  bias[cols_i] and computes its slice of the output. With ``gather_output=True`` the slices are
  concatenated; with ``gather_output=False`` the layer returns the list of per-device slices, ready
  for a following ``partition="row", input_is_split=True`` layer (one reduction for the pair).
- ``partition="row"``: the input features are split; device i holds kernel[rows_i, :] and computes
  a partial product; the partials are summed, then the bias (on the first device) is added once.

Uneven splits work (sizes differ by at most one). The whole kernel is initialised first and then
split, so with the same seed it equals what `keras.layers.Dense` initialises.

>>> import kdist, keras, numpy as np
>>> layer = kdist.layers.ModelParallelDense(5, devices=["/cpu:0", "/cpu:0"])
>>> layer(np.ones((2, 3), "float32")).shape
TensorShape([2, 5])
>>> [tuple(k.shape) for k in layer.kernel_shards]
[(3, 3), (3, 2)]
"""

from __future__ import annotations

import functools

import keras
from keras import ops

from kdist.layers import mappings
from kdist.layers.sharding import DenseOptions, add_shards, pieces_like, split_sizes
from kdist.devices import local_devices

PARTITIONS = ("column", "row")


def default_devices() -> list[str]:
    """This process's GPUs if there are at least two, else its logical CPU devices."""
    from kdist.layers.placement import local_logical_devices

    gpus = local_logical_devices("GPU")
    devices = gpus if len(gpus) > 1 else local_logical_devices("CPU")
    if len(devices) < 2:
        raise ValueError("ModelParallelDense needs at least two devices and this process has one: "
                         "pass devices=[...], or split the CPU with kdist.split_cpu(n) before "
                         "TensorFlow starts")
    return devices


@keras.saving.register_keras_serializable(package="kdist")
class ModelParallelDense(DenseOptions, keras.layers.Layer):
    """Dense layer split over `devices` by output units (column) or input features (row).

    Args:
        units: output size.
        devices: device names (default: local GPUs, else the logical CPU devices; at least two).
        partition: "column" or "row".
        gather_output: column only: concatenate the slices (True) or return them as a list.
        input_is_split: row only: the input is the list a column layer with gather_output=False
            returned.

    The other arguments (activation, use_bias, kernel_initializer, bias_initializer,
    kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint) are as for
    `keras.layers.Dense`.
    """

    def __init__(self, units, devices=None, partition="column", gather_output=True,
                 input_is_split=False, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, kernel_constraint=None,
                 bias_constraint=None, **kwargs):
        super().__init__(**kwargs)
        if partition not in PARTITIONS:
            raise ValueError(f"partition={partition!r}: use 'column' or 'row'")
        if partition == "column" and input_is_split:
            raise ValueError("input_is_split=True is for partition='row' (after a column layer "
                             "with gather_output=False)")
        if partition == "row" and not gather_output:
            raise ValueError("gather_output=False is for partition='column'; a row layer always "
                             "returns the summed output")

        self.devices = list(local_devices(devices)) if devices else default_devices()
        self.units, self.partition = units, partition
        self.gather_output, self.input_is_split = gather_output, input_is_split
        self.set_dense_options(activation, use_bias, kernel_initializer, bias_initializer,
                          kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint)
        if partition == "column":
            split_sizes(units, len(self.devices), "devices")  # at least one unit per device

    # ------------------------------------------------------------------ build
    def build(self, input_shape):
        if self.input_is_split:
            self.feature_sizes = [int(shape[-1]) for shape in input_shape]
            if len(self.feature_sizes) != len(self.devices):
                raise ValueError(f"input_is_split: got {len(self.feature_sizes)} slices for "
                                 f"{len(self.devices)} devices; use the same devices as the column "
                                 "layer before")
            input_dim = sum(self.feature_sizes)
        else:
            input_dim = int(input_shape[-1])
            self.feature_sizes = split_sizes(input_dim, len(self.devices), "devices") \
                if self.partition == "row" else None
        axis = 1 if self.partition == "column" else 0
        self.kernel_shards = add_shards(
            self, "kernel", (input_dim, self.units), axis, self.kernel_initializer,
            self.kernel_regularizer, self.kernel_constraint, len(self.devices), self.devices)
        if self.partition == "row" and self.input_is_split and \
                [int(k.shape[0]) for k in self.kernel_shards] != self.feature_sizes:
            raise ValueError(f"input_is_split: slice sizes {self.feature_sizes} differ from the "
                             "even split of the features; build the column layer before on the "
                             "same devices")
        self.bias_shards = []
        if self.use_bias:
            if self.partition == "column":
                self.bias_shards = add_shards(
                    self, "bias", (self.units,), 0, self.bias_initializer, self.bias_regularizer,
                    self.bias_constraint, len(self.devices), self.devices)
            else:
                self.bias_shards = add_shards(
                    self, "bias", (self.units,), 0, self.bias_initializer, self.bias_regularizer,
                    self.bias_constraint, 1, self.devices[:1])

    # ------------------------------------------------------------------ forward
    def call(self, inputs):
        if self.partition == "column":
            parts = mappings.copy_to_devices(inputs, self.devices)
            outputs = [mappings.compute_on(device, functools.partial(self._column_slice, i), part)
                       for i, (device, part) in enumerate(zip(self.devices, parts))]
            return mappings.gather_from_devices(outputs, self.devices[0]) \
                if self.gather_output else outputs
        parts = list(inputs) if self.input_is_split else mappings.scatter_to_devices(
            inputs, self.feature_sizes, self.devices)
        partials = [mappings.compute_on(device, functools.partial(self._row_partial, i), part)
                    for i, (device, part) in enumerate(zip(self.devices, parts))]
        y = mappings.reduce_from_devices(partials, self.devices[0])
        if self.use_bias:
            y = y + self.bias_shards[0]
        return self.activation(y)

    def _column_slice(self, i, x):
        y = ops.matmul(x, self.kernel_shards[i])
        if self.use_bias:
            y = y + self.bias_shards[i]
        return self.activation(y)

    def _row_partial(self, i, x):
        return ops.matmul(x, self.kernel_shards[i])

    def compute_output_shape(self, input_shape):
        if self.input_is_split:
            input_shape = input_shape[0]
        if self.partition == "column" and not self.gather_output:
            return [(*input_shape[:-1], size) for size in split_sizes(self.units, len(self.devices))]
        return (*input_shape[:-1], self.units)

    # ------------------------------------------------------------------ conversion
    @property
    def kernel(self):
        return ops.concatenate(self.kernel_shards, axis=1 if self.partition == "column" else 0)

    @property
    def bias(self):
        return ops.concatenate(self.bias_shards, axis=0) if self.use_bias else None

    def to_dense(self) -> keras.layers.Dense:
        """An equivalent `keras.layers.Dense` holding the assembled kernel and bias."""
        config = {k: v for k, v in self.get_config().items() if k not in (
            "devices", "partition", "gather_output", "input_is_split")}
        dense = keras.layers.Dense.from_config(config)
        dense.build((None, int(self.kernel.shape[0])))
        dense.set_weights([ops.convert_to_numpy(self.kernel)] +
                          ([ops.convert_to_numpy(self.bias)] if self.use_bias else []))
        return dense

    @classmethod
    def from_dense(cls, layer: keras.layers.Dense, devices=None, partition="column", **kwargs):
        """Splits a built `keras.layers.Dense` over `devices`, keeping its weights."""
        if not layer.built:
            raise ValueError(f"{layer.name} is not built: call it on data (or build it) first")
        config = {k: v for k, v in layer.get_config().items() if k in (
            "name", "units", "activation", "use_bias", "kernel_initializer", "bias_initializer",
            "kernel_regularizer", "bias_regularizer", "kernel_constraint", "bias_constraint",
            "dtype", "trainable")}
        split = cls.from_config({**config, "devices": devices, "partition": partition, **kwargs})
        kernel = ops.convert_to_numpy(layer.kernel)
        split.build((None, kernel.shape[0]))
        axis = 1 if partition == "column" else 0
        weights = pieces_like(kernel, split.kernel_shards, axis)
        if layer.use_bias:
            weights += pieces_like(ops.convert_to_numpy(layer.bias), split.bias_shards, 0)
        split.set_weights(weights)
        return split

    def get_config(self):
        return {**super().get_config(), "units": self.units, "devices": self.devices,
                "partition": self.partition, "gather_output": self.gather_output,
                "input_is_split": self.input_is_split,
                **self.dense_options_config()}
