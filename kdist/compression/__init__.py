"""Gradient compression for synchronous data parallelism (Mirrored and MultiWorkerMirrored).

>>> import kdist, keras
>>> with kdist.scope(compression=kdist.compression.PowerSGD(rank=4)):
...     model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64), keras.layers.Dense(1)])
...     model.compile(optimizer="adam", loss="mse")        # any Keras 3 optimizer
>>> round(kdist.compression.stats(model)["comm_ratio"], 1)    # 64x64 kernel 8x, the rest plain
6.6

Compressors: `NoCompression` and those of `kdist.compression.registry` (`FP16`, `BF16`,
`PowerSGD`, `TopK`); by name with `from_name("powersgd:4")`. Write your own by subclassing
`Compressor` (state + compress/decompress), and give it a name with one line in the registry.
`aggregate_every=k` in `kdist.scope()` accumulates gradients locally and all-reduces their mean
every k steps.

The compressors load on first use (they need TensorFlow; the registry's names do not).
"""

import importlib as _importlib

from kdist.compression import registry as _registry

_LAZY = {"Comm": "kdist.compression.base", "Compressor": "kdist.compression.base",
         "NoCompression": "kdist.compression.base", "from_name": "kdist.compression.registry",
         "stats": "kdist.exchange.stats", **_registry.classes()}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'kdist.compression' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = sorted(_LAZY)
