"""kdist: distributed training for Keras 3 on TensorFlow, from one laptop to a cluster.

>>> import kdist, keras
>>> with kdist.scope():            # Mirrored / MultiWorkerMirrored / ParameterServer from TF_CONFIG
...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
...     model.compile(optimizer="sgd", loss="mse")
"""

import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import logging as _logging
import os as _os
import sys as _sys


class _CloneStrategies(_importlib_abc.MetaPathFinder):
    """`kdist.strategies` from a clone's own strategies/ folder, where a script runs next to the
    sources (the clone's kdist/ then shadows the installed package, which holds strategies/
    inside it; an editable install maps it itself)."""

    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if name != "kdist.strategies":
            return None
        return _importlib_util.spec_from_file_location(
            name, _os.path.join(self.folder, "__init__.py"),
            submodule_search_locations=[self.folder])


def _strategies_of_a_clone() -> None:
    here = _os.path.dirname(_os.path.abspath(__file__))
    folder = _os.path.join(_os.path.dirname(here), "strategies")
    if _os.path.isdir(_os.path.join(here, "strategies")) or \
            not _os.path.isfile(_os.path.join(folder, "__init__.py")) or \
            _importlib_util.find_spec("kdist.strategies") is not None:
        return  # installed (or editable): kdist.strategies is found as it is
    _sys.meta_path.append(_CloneStrategies(folder))


_strategies_of_a_clone()

from kdist import envvars as _envvars, failure as _failure  # noqa: E402
from kdist.cluster import ClusterSpec, ClusterSpecError, cluster  # noqa: E402
from kdist.devices import split_cpu  # noqa: E402
from kdist import scope as _scope_module  # noqa: E402
from kdist.keras_seam import hooks as _hooks, versions as _versions  # noqa: E402
from kdist.scope import current_strategy, scope, strategy  # noqa: E402
from kdist.ps.serve import serve  # noqa: E402
from kdist.wiring.keras_hooks import KdistHooks as _KdistHooks  # noqa: E402

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
    "balance": ("kdist.balance", None),
    "barrier": ("kdist.barriers", "barrier"),
    "callbacks": ("kdist.callbacks", None),
    "check_replicas": ("kdist.replicas", "check_replicas"),
    "ReplicasDisagree": ("kdist.replicas", "ReplicasDisagree"),
    "compression": ("kdist.compression", None),
    "layers": ("kdist.layers", None),
    "LinearWarmup": ("kdist.batching", "LinearWarmup"),
    "TrainingOptions": ("kdist.wiring.options", "TrainingOptions"),
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
    "ReplicasDisagree",
    "TrainingOptions",
    "balance",
    "barrier",
    "callbacks",
    "check_replicas",
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


def _prepare_multi_worker() -> None:
    """The tutorials' order: a script may build datasets and tensors before `kdist.scope()`.

    When this process's TF_CONFIG names several chief/worker tasks and no ps, TensorFlow's first op
    builds MultiWorkerMirroredStrategy first (`kdist.scope.build_multi_worker_before_first_op`).
    `KDIST_EAGER_MULTI_WORKER=0` turns this off. The `kdist` command line never does it.
    """
    if not _switch(_envvars.EAGER_MULTI_WORKER) or _running_the_command_line():
        return
    if _os.environ.get(_envvars.STRATEGY, "auto").strip() not in ("", "auto", "multi_worker"):
        return
    try:
        spec = cluster()
    except ClusterSpecError:
        return  # kdist.scope() raises it, naming the field and the fix
    if spec.num_workers > 1 and not spec.has_ps and spec.task_type in ("chief", "worker"):
        _scope_module.build_multi_worker_before_first_op()


def _switch(name: str) -> bool:
    """An on/off environment variable (default on); another value is named in one warning line
    and read as on."""
    text = _os.environ.get(name, "1").strip().lower()
    if text in ("0", "false", "no", "off"):
        return False
    if text not in ("1", "true", "yes", "on", ""):
        _logger.warning("kdist: %s=%r is neither 0 nor 1; read as 1 (set 0 to turn it off)", name,
                        _os.environ[name])
    return True


def _running_the_command_line() -> bool:
    argv = getattr(_sys, "orig_argv", _sys.argv)
    return _os.path.basename(_sys.argv[0]) == "kdist" or any(
        a == "-m" and b in ("kdist", "kdist.cli") for a, b in zip(argv, argv[1:]))


_hooks.connect(_KdistHooks())  # kdist's features at the seam's hook points (kdist.keras_seam)
_failure.install()  # an uncaught exception leaves a record where the platform shows it
_outside = _versions.outside_range_line()
if _outside:
    _logger.warning(_outside)
_prepare_multi_worker()
