"""Strategy builders: one module per `tf.distribute` strategy, all fed by one `kdist.ClusterSpec`.

>>> import kdist
>>> from kdist import strategies
>>> strategies.choose(kdist.cluster(), strategies.StrategyOptions(), num_gpus=0)
'default'
"""

from kdist.keras_seam.strategy_kinds import is_multi_worker, is_parameter_server
from kdist.strategies import default, mirrored, multi_worker, parameter_server, registry
from kdist.strategies.options import StrategyOptions
from kdist.strategies.plan import StrategyPlan
from kdist.strategies.registry import cluster_of, plan_of

_MODULES = {
    "default": default,
    "mirrored": mirrored,
    "multi_worker": multi_worker,
    "parameter_server": parameter_server,
}
NAMES = tuple(_MODULES)


def choose(cluster, options: StrategyOptions, num_gpus: int, num_cpus: int = 1) -> str:
    """The strategy `auto` picks: ps -> parameter_server; more than one worker -> multi_worker;
    more than one local GPU, explicit devices or a CPU split into logical devices
    (`kdist.split_cpu`) -> mirrored; else default."""
    if cluster.has_ps:
        return "parameter_server"
    if cluster.num_workers > 1:
        return "multi_worker"
    if num_gpus > 1 or (options.devices is not None and len(options.devices) > 1) or \
            (num_gpus == 0 and num_cpus > 1):
        return "mirrored"
    return "default"


def build(name: str, cluster, options: StrategyOptions):
    """Builds strategy `name` for `cluster` with `options`; `plan_of()` then finds its plan."""
    strategy = _module(name).build(cluster, options)
    if not (name == "default" and options.devices is None):  # TF's global default strategy
        over_tcp = name == "multi_worker" and multi_worker.sums_over_tcp(strategy, options)
        registry.remember(strategy, StrategyPlan(name, cluster, options, over_tcp))
    return strategy


def inapplicable_options(name: str, options: StrategyOptions) -> list[str]:
    """Options set by the user that strategy `name` does not use."""
    return sorted(options.given() - _module(name).OPTIONS)


def _module(name: str):
    if name not in _MODULES:
        raise ValueError(f"strategy={name!r}: use 'auto' or one of {', '.join(NAMES)}")
    return _MODULES[name]


__all__ = ["NAMES", "StrategyOptions", "StrategyPlan", "build", "choose", "cluster_of",
           "inapplicable_options", "is_multi_worker", "is_parameter_server", "plan_of"]
