"""Top-k sparsification with error feedback (Lin et al. 2018, "Deep Gradient Compression")."""

from __future__ import annotations

import math

from kdist.compression.base import Compressor, _numel


class TopK(Compressor):
    """Sends the `ratio` largest-magnitude entries of each gradient (values + int32 indices) and
    keeps the rest as a residual added to the next step's gradient (`error_feedback`).

    The selected entries differ between replicas, so they are all-gathered, not all-reduced.

    `momentum` > 0 applies DGC's momentum correction: the compressor accumulates the velocity
    u = momentum * u + g instead of the gradient and clears u and the residual where it sent
    (factor masking); use it with a momentum-free optimizer (e.g. `SGD(lr)`), since sparsifying
    after the optimizer's own momentum loses accuracy (Lin et al. 2018, section 3.2).
    """

    collective = "all_gather"

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True, momentum: float = 0.0,
                 min_compression_rate: float = 2.0, start_step: int = 0):
        super().__init__(min_compression_rate, start_step)
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio={ratio!r}: use a fraction in (0, 1], e.g. 0.01 for 1%")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum={momentum!r}: use a value in [0, 1)")
        if momentum and not error_feedback:
            raise ValueError("momentum correction needs error_feedback=True")
        self.ratio, self.error_feedback, self.momentum = ratio, error_feedback, momentum

    def _k(self, shape) -> int:
        return max(1, math.ceil(self.ratio * _numel(shape)))

    def payload_bytes(self, shape) -> int:
        return 8 * self._k(shape)  # float32 value + int32 index

    def state_spec(self, shape):
        spec = {"residual": (tuple(shape), "zeros")} if self.error_feedback else {}
        if self.momentum:
            spec["velocity"] = (tuple(shape), "zeros")
        return spec

    def compress(self, grad, state, replicas):
        import tensorflow as tf

        flat = tf.reshape(grad, [-1])
        if self.momentum:
            velocity = self.momentum * tf.reshape(state["velocity"].value, [-1]) + flat
            flat = velocity
        if self.error_feedback:
            flat = flat + tf.reshape(state["residual"].value, [-1])
        _, indices = tf.math.top_k(tf.abs(flat), k=self._k(grad.shape))
        values = tf.gather(flat, indices)
        if self.error_feedback:
            unsent = 1.0 - tf.scatter_nd(indices[:, None], tf.ones_like(values), tf.shape(flat))
            state["residual"].assign(tf.reshape(flat * unsent, grad.shape))
            if self.momentum:  # factor masking: no momentum left where the update was sent
                state["velocity"].assign(tf.reshape(velocity * unsent, grad.shape))
        return (values, tf.cast(indices, tf.int32)), None

    def decompress(self, payload, meta, grad, state, replicas):
        import tensorflow as tf

        values, indices = payload  # every replica's entries, concatenated
        summed = tf.scatter_nd(indices[:, None], values, [_numel(grad.shape)])  # adds duplicates
        return tf.reshape(summed, grad.shape)
