"""BatchNormalization layers that normalize each replica's share with its own statistics.

One device normalizes a batch with that batch's mean and variance; under N replicas Keras's
`BatchNormalization()` normalizes each replica's share with the share's own (as DDP's default
`BatchNorm` does), so training differs from one device's (0.017 on the conformance matrix's MLP
after 2 epochs). `BatchNormalization(synchronized=True)` computes them from the global batch and
is exact, at a cost: benchmarks/batchnorm.py measures it on a small CNN on 2 CPU workers (about a
third of the step, far above the 5% at which kdist would make it the default), so the default
stays and kdist says which layers normalize per replica, once per model at its first fit, and in
`kdist verify`'s report.
"""

from __future__ import annotations

import logging

from kdist import model_state as states
from kdist.keras_seam import keras_internals

logger = logging.getLogger("kdist")
SHOWN = 3  # layer names a line shows


def per_replica(model) -> list[str]:
    """The names of `model`'s BatchNormalization layers that normalize per replica."""
    import keras

    return [layer.name for layer in keras_internals.all_layers(model)
            if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized]


def named(layers: list[str]) -> str:
    """`layers` for a log line: the first few names, then how many more."""
    shown = ", ".join(layers[:SHOWN])
    return shown + (f" and {len(layers) - SHOWN} more" if len(layers) > SHOWN else "")


def say_once(model, replicas: int) -> None:
    """Says, once per model, which of its BatchNormalization layers normalize each of the
    `replicas`' share on its own, and the switch that makes them one device's."""
    state = states.of(model)
    layers = per_replica(model)
    if state.said_batch_statistics or not layers:
        return
    state.said_batch_statistics = True
    logger.warning(
        "kdist: %d BatchNormalization layer(s) of %s (%s) normalize each of the %d replicas' "
        "share with the share's own statistics, not the global batch's as one device does; "
        "BatchNormalization(synchronized=True) makes them one device's, at a cost measured by "
        "benchmarks/batchnorm.py (docs/benchmarks.md)", len(layers), model.name, named(layers),
        replicas)
