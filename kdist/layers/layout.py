"""Keras 3's distribution vocabulary on TensorFlow: a `LayoutMap` turned into model-parallel layers.

Keras 3 describes model parallelism with `keras.distribution.DeviceMesh` and `LayoutMap` (variable
path patterns -> layouts), but only its JAX backend carries them out. `from_layout_map` reads the
same objects and returns a copy of a model in which every `Dense` whose kernel the map shards along
the mesh's model axis is a `ModelParallelDense` over that axis's devices, with the same weights.
Variables are looked up by `variable.path` (e.g. ``"sequential/up/kernel"``), as Keras's own
`ModelParallel` does; Keras 3.15 matches each key as a regular expression against the whole path.

- kernel ``(None, "model")`` (output units split): ``partition="column"``; the bias, if the map
  names it, must be ``("model",)``;
- kernel ``("model", None)`` (input features split): ``partition="row"``; the bias, if named, must
  be ``(None,)`` (it is added once, after the partial products are summed);
- an `Embedding` table ``("model", None)`` (vocabulary rows split) or ``(None, "model")``
  (embedding dimensions split) becomes a `ModelParallelEmbedding` with ``partition="row"`` or
  ``"column"``;
- every other variable must be replicated (no layout, or only None axes): it stays as it is.

Whatever else the map asks (a convolution kernel or a normalisation weight sharded, a table or
kernel split on both axes, a mesh with a batch axis longer than 1) is refused with the variable path
and the layout. Data parallelism comes from the strategy instead: convert inside `kdist.scope()`
on each worker, with the mesh (1, that worker's devices), and MultiWorkerMirrored replicates the
split model across the workers, each shard stored on its own device (`kdist.layers.placement`).

>>> import kdist, keras, numpy as np
>>> mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["/cpu:0", "/cpu:0"])
>>> layout_map = keras.distribution.LayoutMap(mesh)
>>> layout_map[".*up/kernel"], layout_map[".*down/kernel"] = (None, "model"), ("model", None)
>>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="up"),
...                           keras.layers.Dense(4, name="down")])
>>> split = kdist.layers.from_layout_map(model, layout_map)
>>> [type(layer).__name__ for layer in split.layers]
['ModelParallelDense', 'ModelParallelDense']
>>> x = np.ones((2, 4), "float32")
>>> bool(np.allclose(split(x), model(x), atol=1e-6))
True
"""

from __future__ import annotations

import keras

from kdist.layers.model_parallel import ModelParallelDense
from kdist.layers.model_parallel_embedding import ModelParallelEmbedding


class LayoutError(ValueError):
    """A layout kdist cannot honour on TensorFlow: names the variable path and the layout."""

    def __init__(self, subject: str, problem: str, fix: str):
        super().__init__(f"{subject}: {problem}. Fix: {fix}")


def _entry(path, layout) -> str:
    return f"LayoutMap[{path!r}] = {layout}"


def from_layout_map(model: keras.Model, layout_map) -> keras.Model:
    """A copy of the built `model` with the Dense (Embedding) layers `layout_map` shards as
    `ModelParallelDense` (`ModelParallelEmbedding`) over the devices of the mesh's model axis,
    every weight kept."""
    if not model.built:
        raise ValueError(f"{model.name} is not built: give it an Input (or call it on data) first")
    axis, devices = _model_axis(layout_map)
    partitions = {id(layer): _partition(layer, layout_map, axis) for layer in model.layers}

    def convert(layer):
        partition = partitions.get(id(layer))
        if partition is None:
            return layer.__class__.from_config(layer.get_config())
        if isinstance(layer, keras.layers.Embedding):
            return ModelParallelEmbedding.from_embedding(layer, devices=devices,
                                                         partition=partition)
        return ModelParallelDense.from_dense(layer, devices=devices, partition=partition)

    converted = keras.models.clone_model(model, clone_function=convert)
    for old, new in zip(model.layers, converted.layers):
        if partitions.get(id(old)) is None:
            new.set_weights(old.get_weights())
    return converted


def _model_axis(layout_map) -> tuple[str | None, list[str]]:
    """The one mesh axis the map's layouts shard on, and its devices (every other axis is 1)."""
    mesh = layout_map.device_mesh
    used = sorted({name for key in layout_map.keys() for name in layout_map[key].axes if name})
    if len(used) > 1:
        raise LayoutError(f"LayoutMap keys {list(layout_map.keys())}", f"the layouts shard on "
                          f"several mesh axes {used}", "shard on one model axis; data "
                          "parallelism comes from kdist.scope()")
    if not used:
        return None, []
    axis = used[0]
    if axis not in mesh.axis_names:
        raise LayoutError(f"DeviceMesh axis_names={list(mesh.axis_names)}",
                          f"the layouts shard on {axis!r}, which the mesh does not have",
                          "use one of the mesh's axis names")
    others = [size for name, size in zip(mesh.axis_names, mesh.shape) if name != axis]
    if any(size != 1 for size in others):
        raise LayoutError(f"DeviceMesh shape={tuple(mesh.shape)}, axis_names="
                          f"{list(mesh.axis_names)}", f"axes other than {axis!r} (the batch axis) "
                          "longer than 1: the batch axis is the strategy's, not the map's",
                          "give each worker the mesh (1, its devices) and convert inside "
                          "kdist.scope(); MultiWorkerMirrored adds the data parallelism")
    return axis, [str(device) for device in mesh.devices.reshape(-1)]


def _partition(layer, layout_map, axis) -> str | None:
    """'column', 'row' or None (replicated) for one Dense or Embedding layer (an Embedding's
    'row' splits the vocabulary); refuses what cannot be honoured."""
    layouts = {v.path: _axes(layout_map, v.path) for v in layer.weights}
    sharded = {path: axes for path, axes in layouts.items() if axes and any(axes)}
    if not sharded:
        return None
    if type(layer) is keras.layers.Embedding:
        return _split(*next(iter(sharded.items())), axis, "an Embedding table",
                      ("embedding dimensions", "vocabulary"))
    kernel_path = layer.kernel.path if type(layer) is keras.layers.Dense else None
    if kernel_path not in sharded:
        path, axes = next(iter(sharded.items()))
        raise LayoutError(_entry(path, axes), f"kdist shards only Dense kernels and Embedding "
                          f"tables on TensorFlow, and this is a weight of {type(layer).__name__} "
                          f"{layer.name!r}", "replicate it (no layout, or "
                          "None on every axis)")
    partition = _split(kernel_path, sharded[kernel_path], axis, "a Dense kernel",
                       ("output", "input"))
    if layer.use_bias:
        bias = layouts[layer.bias.path]
        wanted = (axis,) if partition == "column" else (None,)
        if bias is not None and tuple(bias) != wanted:
            kept = "split with the output units" if partition == "column" else "whole, added once"
            raise LayoutError(_entry(layer.bias.path, bias),
                              f"a {partition}-split Dense keeps its bias {kept}",
                              f"use {wanted}, or leave the bias out of the map")
    return partition


def _split(path, axes, axis, what, names) -> str:
    """'column' for (None, axis), 'row' for (axis, None); refuses any other layout of `what`,
    whose axes 1 and 0 are called `names`."""
    partition = {(None, axis): "column", (axis, None): "row"}.get(tuple(axes))
    if partition is None:
        raise LayoutError(_entry(path, axes), f"{what} is split on its {names[0]} axis "
                          f"(None, {axis!r}) or its {names[1]} axis ({axis!r}, None)",
                          "use one of these two layouts")
    return partition


def _axes(layout_map, path):
    layout = layout_map[path]
    return None if layout is None else tuple(layout.axes)
