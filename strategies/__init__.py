"""Strategy builders: one module per `tf.distribute` strategy, all fed by one `kdist.ClusterSpec`.

>>> import kdist, strategies
>>> strategies.choose(kdist.cluster(), strategies.StrategyOptions(), num_gpus=0)
'default'
"""

from strategies import default, mirrored, multi_worker, parameter_server
from strategies.options import StrategyOptions

_MODULES = {
    "default": default,
    "mirrored": mirrored,
    "multi_worker": multi_worker,
    "parameter_server": parameter_server,
}
NAMES = tuple(_MODULES)


def choose(cluster, options: StrategyOptions, num_gpus: int) -> str:
    """The strategy `auto` picks: ps -> parameter_server; >1 worker -> multi_worker;
    >1 local GPU or explicit devices -> mirrored; else default."""
    if cluster.has_ps:
        return "parameter_server"
    if cluster.num_workers > 1:
        return "multi_worker"
    if num_gpus > 1 or (options.devices is not None and len(options.devices) > 1):
        return "mirrored"
    return "default"


def build(name: str, cluster, options: StrategyOptions):
    """Builds strategy `name` for `cluster` with `options`."""
    return _module(name).build(cluster, options)


def inapplicable_options(name: str, options: StrategyOptions) -> list[str]:
    """Options set by the user that strategy `name` does not use."""
    return sorted(options.given() - _module(name).OPTIONS)


def _module(name: str):
    if name not in _MODULES:
        raise ValueError(f"strategy={name!r}: use 'auto' or one of {', '.join(NAMES)}")
    return _MODULES[name]


__all__ = ["NAMES", "StrategyOptions", "build", "choose", "inapplicable_options"]
