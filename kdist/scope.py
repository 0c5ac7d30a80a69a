"""`kdist.scope()`: pick, build and enter the right `tf.distribute` strategy for this process.

>>> import kdist, keras
>>> with kdist.scope() as strategy:            # TF_CONFIG + devices decide the strategy
...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
...     model.compile(optimizer="sgd", loss="mse")
>>> strategy.num_replicas_in_sync
1
"""

from __future__ import annotations

import contextlib
import logging
import os

import strategies
from kdist import keras_compat
from kdist.keras_ps import is_parameter_server
from kdist.cluster import cluster
from kdist.serve import serve

logger = logging.getLogger("kdist")

STRATEGY_ENV = "KDIST_STRATEGY"
_built: dict = {}  # (name, options, cluster) -> strategy: entering again reuses the strategy
_current = None  # the strategy of the last kdist.scope()/kdist.strategy() call


def strategy(strategy: str = "auto", **options):
    """The strategy `kdist.scope()` would enter, built once per configuration and then reused.

    Args:
        strategy: ``"auto"`` (default), ``"default"``, ``"mirrored"``, ``"multi_worker"`` or
            ``"parameter_server"``. The ``KDIST_STRATEGY`` environment variable overrides ``"auto"``.
        **options: see `strategies.StrategyOptions` (devices, all_reduce, bytes_per_pack,
            collective_timeout, variable_partitioner).
    """
    return _build_or_reuse(strategy, options)


def _build_or_reuse(requested: str, options: dict):
    global _current
    name = _requested_name(requested)
    opts = strategies.StrategyOptions.from_kwargs(options)
    spec = cluster()
    if spec.has_ps and spec.task_type in ("ps", "worker"):
        serve(spec)  # a ps/worker task of parameter-server training: serves, then exits the process
    if name == "auto":
        name = strategies.choose(spec, opts, num_gpus=_num_gpus())
    key = (name, opts, spec)
    if key not in _built:
        keras_compat.install()
        _built[key] = strategies.build(name, spec, opts)
        _log_choice(name, _built[key], spec, opts)
    _current = _built[key]
    return _current


@contextlib.contextmanager
def scope(strategy: str = "auto", compression=None, aggregate_every: int = 1, **options):
    """Context manager: enters the chosen strategy's scope and yields the strategy.

    `compression` (a `kdist.compression.Compressor`) and `aggregate_every` (all-reduce every k
    steps, accumulating locally) apply to the models compiled inside the block, under Mirrored and
    MultiWorkerMirrored.

    On the ps and worker tasks of a parameter-server cluster it never returns: the process serves
    the chief (`kdist.serve()`) and exits when the chief is done.

    Auto-selection: a ps job in TF_CONFIG -> ParameterServer; more than one chief/worker ->
    MultiWorkerMirrored; more than one local GPU or several `devices=` -> Mirrored; else the
    default strategy. Create models and call `compile()` inside the block.
    """
    from kdist.compression import hook as compression_hook  # needs Keras: imported on use

    chosen = _build_or_reuse(strategy, options)
    if (compression is not None or aggregate_every != 1) and is_parameter_server(chosen):
        raise ValueError(
            "compression/aggregate_every apply to all-reduce strategies. Under ParameterServer "
            "no gradient is exchanged as such: a worker reads each variable (and optimizer slot) "
            "from the ps and writes the updated float32 values back, so casting or compressing "
            "gradients would not shrink that traffic")
    with chosen.scope(), compression_hook.activated(compression, aggregate_every):
        yield chosen


def current_strategy():
    """The strategy of the most recent `kdist.scope()`, else TensorFlow's current strategy."""
    import tensorflow as tf

    return _current if _current is not None else tf.distribute.get_strategy()


def _requested_name(argument: str) -> str:
    from_env = os.environ.get(STRATEGY_ENV, "").strip()
    if from_env and argument != "auto" and from_env != argument:
        raise ValueError(f"kdist.scope(strategy={argument!r}) conflicts with "
                         f"{STRATEGY_ENV}={from_env!r}: unset the variable or drop the argument")
    name = argument if argument != "auto" else (from_env or "auto")
    if name != "auto" and name not in strategies.NAMES:
        source = "strategy" if argument != "auto" else STRATEGY_ENV
        raise ValueError(f"{source}={name!r}: use 'auto' or one of {', '.join(strategies.NAMES)}")
    return name


def _num_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _log_choice(name, built, spec, opts) -> None:
    unused = strategies.inapplicable_options(name, opts)
    note = f"; options not used by this strategy: {', '.join(unused)}" if unused else ""
    logger.info("kdist: strategy %s (%s), %d replica(s) in sync, task %s%s", name,
                type(built).__name__, built.num_replicas_in_sync, spec.task or "local", note)
