"""The chief's ClusterCoordinator of a ParameterServerStrategy, and what every part of kdist's
parameter-server loop shares: joining the scheduled steps (a lost ps named), and the tf.functions
traced once per model compilation.

>>> issubclass(ParameterServerFailure, RuntimeError)
True
"""

from __future__ import annotations

import re

from kdist import global_state, model_state
from kdist.keras_seam import keras_internals
from kdist.strategies import cluster_of


class ParameterServerFailure(RuntimeError):
    """A parameter server was lost during training; the variables it held are gone."""


def coordinator(strategy):
    """The one ClusterCoordinator of `strategy` (TF allows only one per strategy)."""
    import tensorflow as tf

    kept = global_state.of_strategy(strategy)
    if kept.coordinator is None:
        kept.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    return kept.coordinator


def cached_function(model, name, make):
    """`make()`'s tf.function, traced once per model compilation (a recompiled model gets new ones,
    as Keras resets its own train/test functions in compile())."""
    cache = model_state.of(model).functions
    key = (name, *keras_internals.compilation(model))
    if key not in cache:
        cache[key] = make()
    return cache[key]


def join_scheduled(strategy) -> None:
    """Waits until every scheduled function has run; a lost ps raises `ParameterServerFailure`."""
    import tensorflow as tf

    try:
        coordinator(strategy).join()
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
            tf.errors.NotFoundError) as err:
        # TF's message may name every ps the failed function touched (TF 2.17 does): name the
        # ones that no longer accept connections, and fall back to the message only if none.
        lost = _unreachable_ps(strategy) or sorted(
            set(re.findall(r"/job:ps/replica:0/task:(\d+)", str(err))))
        which = ", ".join(f"ps:{i}" for i in lost) or "a parameter server"
        raise ParameterServerFailure(
            f"{which} failed during training ({type(err).__name__}); the variables it held are "
            "lost. Restart the job: with kdist.callbacks.BackupAndRestore it resumes from the last "
            "completed epoch") from err


def num_workers(strategy) -> int:
    return len(cluster_of(strategy).jobs["worker"])


def _unreachable_ps(strategy) -> list[str]:
    """Indices of the ps tasks whose address refuses a TCP connection now."""
    import socket

    spec = cluster_of(strategy)
    lost = []
    for index, address in enumerate(spec.jobs.get("ps", ()) if spec is not None else ()):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
        except OSError:
            lost.append(str(index))
    return lost
