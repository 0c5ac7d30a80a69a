"""`kdist.cluster()`: the cluster this process belongs to, read from its environment.

TF_CONFIG first; when it is unset, the Slurm job step this process is a task of
(`kdist.cluster.slurm`); otherwise a single process. The result is memoized on the variables it was
read from, so callers may ask as often as they like and still see a changed environment.

>>> import kdist
>>> kdist.cluster().is_distributed        # no TF_CONFIG here
False
"""

from __future__ import annotations

import os

from kdist import global_state
from kdist.cluster import slurm
from kdist.cluster.spec import ClusterSpec


def _environment_key() -> tuple:
    names = ("TF_CONFIG", *slurm.VARIABLES)
    return tuple(os.environ.get(name) for name in names)


def cluster() -> ClusterSpec:
    """The cluster of this process: TF_CONFIG, else the Slurm step, else a single process.

    Raises `ClusterSpecError` naming the field and the fix when TF_CONFIG (or a Slurm variable) is
    malformed.
    """
    key = _environment_key()
    cache = global_state.process().environment  # {key: ClusterSpec}
    if key not in cache:
        cache.clear()  # one environment at a time: keep only the newest
        cache[key] = _read()
    return cache[key]


def _read() -> ClusterSpec:
    tf_config = os.environ.get("TF_CONFIG", "")
    if not tf_config.strip() and slurm.in_slurm_step():
        return slurm.cluster_from_slurm()
    return ClusterSpec.from_tf_config(tf_config, from_environment=True)
