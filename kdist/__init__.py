"""kdist: distributed training for Keras 3 on TensorFlow, from one laptop to a cluster.

>>> import kdist, keras
>>> with kdist.scope():            # Mirrored / MultiWorkerMirrored / ParameterServer from TF_CONFIG
...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
...     model.compile(optimizer="sgd", loss="mse")
"""

import importlib as _importlib
import logging as _logging

from kdist.cluster import ClusterSpec, ClusterSpecError, cluster
from kdist.devices import split_cpu
from kdist.scope import current_strategy, scope, strategy
from kdist.serve import serve

__version__ = "0.1.0"

_logger = _logging.getLogger("kdist")
if not _logger.handlers:  # visible by default, like absl; configure the "kdist" logger to change it
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("%(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(_logging.INFO)
    _logger.propagate = False

# Names that need Keras (and so TensorFlow) load on first use: `kdist launch` and `kdist validate`
# then start without importing TensorFlow.
_LAZY = {
    "callbacks": ("kdist.callbacks", None),
    "compression": ("kdist.compression", None),
    "layers": ("kdist.layers", None),
    "LinearWarmup": ("kdist.batching", "LinearWarmup"),
    "global_batch_size": ("kdist.batching", "global_batch_size"),
    "scale_learning_rate": ("kdist.batching", "scale_learning_rate"),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'kdist' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = _importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


__all__ = [
    "ClusterSpec",
    "ClusterSpecError",
    "LinearWarmup",
    "callbacks",
    "cluster",
    "compression",
    "current_strategy",
    "global_batch_size",
    "layers",
    "scale_learning_rate",
    "scope",
    "serve",
    "split_cpu",
    "strategy",
]
