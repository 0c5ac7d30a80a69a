"""Gradient compression for synchronous data parallelism (Mirrored and MultiWorkerMirrored).

>>> import kdist, keras
>>> with kdist.scope(compression=kdist.compression.PowerSGD(rank=4)):
...     model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64), keras.layers.Dense(1)])
...     model.compile(optimizer="adam", loss="mse")        # any Keras 3 optimizer
>>> round(kdist.compression.stats(model)["comm_ratio"], 1)    # 64x64 kernel 8x, the rest plain
6.6

Compressors: `NoCompression`, `FP16`, `BF16`, `PowerSGD`, `TopK`; by name with
`from_name("powersgd:4")`. Write your own by subclassing
`Compressor` (state + compress/decompress). `aggregate_every=k` in `kdist.scope()` accumulates
gradients locally and all-reduces their mean every k steps.
"""

from kdist.compression.base import Comm, Compressor, NoCompression
from kdist.compression.casting import BF16, FP16
from kdist.exchange.stats import stats
from kdist.compression.names import from_name
from kdist.compression.powersgd import PowerSGD
from kdist.compression.topk import TopK

__all__ = ["BF16", "FP16", "Comm", "Compressor", "NoCompression", "PowerSGD", "TopK", "from_name",
           "stats"]
