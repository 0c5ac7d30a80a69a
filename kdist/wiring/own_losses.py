"""A `train_step` of the user's whose loss Keras never divided by the replicas: said once.

From Keras 3.8 a loss object or `compute_loss` divides the loss's gradient by the replicas in
sync (kdist keeps the value: fix `loss_value_per_replica`), so the summed gradients are one
device's. A loss the user reduces without them (`ops.mean` over the replica's rows, as keras.io's
VAE and WGAN-GP write it) is not divided, and the step is N times one device's with N replicas;
a loss the user divided already (`tf.nn.compute_average_loss`, a division by
`num_replicas_in_sync`) is right. The graph cannot tell the two apart, so where a replica's step
exchanges gradients and no loss of its trace went through Keras's division, kdist says so once
per model, at the first step's trace, naming the `train_step` and the fix.
"""

from __future__ import annotations

import functools
import logging
import threading

from kdist import model_state as states
from kdist.keras_seam import keras_internals

logger = logging.getLogger("kdist")
_local = threading.local()


def watching(train_step):
    """Wraps a model's own `train_step` so that its trace records whether Keras divided a loss."""
    model = keras_internals.model_of(train_step)

    @functools.wraps(train_step)
    def step(data):
        _local.watched, _local.divided = model, False
        try:
            return train_step(data)
        finally:
            _local.watched = None

    return step


def loss_divided() -> None:
    """Keras divided a loss by the replicas in the step being traced on this thread."""
    _local.divided = True


def check(replicas: int) -> None:
    """Called where a replica's step exchanges its gradients: says, once per model, that its
    `train_step` differentiated no loss Keras divided by the `replicas`."""
    model = getattr(_local, "watched", None)
    if model is None or _local.divided:
        return
    state = states.of(model)
    if state.warned_unscaled_step:
        return
    state.warned_unscaled_step = True
    logger.warning(
        "kdist: %s.train_step differentiates a loss that Keras did not divide by the %d replicas "
        "(it came from neither self.compute_loss nor a keras.losses object). If it is a mean over "
        "the replica's batch (ops.mean), each step is %d times one device's: divide it by "
        "kdist.strategy().num_replicas_in_sync (as tf.nn.compute_average_loss does with the "
        "global batch), or compute it with self.compute_loss. If it is divided already, nothing "
        "to do: kdist cannot tell the two apart", type(model).__name__, replicas, replicas)
