"""Top-k sparsification with error feedback (Lin et al. 2018, "Deep Gradient Compression")."""

from __future__ import annotations

import math

from kdist import validators
from kdist.compression.base import Compressor, numel


class TopK(Compressor):
    """Sends the `ratio` largest-magnitude entries of each gradient (values + int32 indices) and
    keeps the rest as a residual added to the next step's gradient (`error_feedback`).

    The selected entries differ between replicas, so they are all-gathered, while that moves
    fewer bytes than summing them scattered into the dense gradient (`route`): with many replicas
    or a large ratio (a warm-up stage), the dense all-reduce is cheaper. Either way the same
    entries are sent and summed.

    `momentum` > 0 applies DGC's momentum correction: the compressor accumulates the velocity
    u = momentum * u + g instead of the gradient and clears u and the residual where it sent
    (factor masking); use it with a momentum-free optimizer (e.g. `SGD(lr)`), since sparsifying
    after the optimizer's own momentum loses accuracy (Lin et al. 2018, section 3.2).

    `warmup` is DGC's sparsity warm-up: ratios sent before `ratio`, each for `warmup_steps`
    optimizer steps, e.g. ``(0.25, 0.0625, 0.0156)`` then 0.01 (each ratio is traced once).
    `values="float16"` sends the values in half precision (6 bytes per entry instead of 8).
    `clip_norm` is DGC's local gradient clipping: each replica clips its gradient of each tensor
    to the L2 norm clip_norm / sqrt(replicas) before accumulating it (per tensor, where DGC clips
    the whole gradient: the compressor sees one tensor at a time).

    Examples:
        >>> topk = TopK(0.01, warmup=(0.25, 0.0625), warmup_steps=10)
        >>> [topk.stage_at(step) for step in (0, 9, 10, 20, 500)]
        [0.25, 0.25, 0.0625, 0.01, 0.01]
    """

    collective = "all_gather"

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True, momentum: float = 0.0,
                 min_compression_rate: float = 2.0, start_step: int = 0, warmup=(),
                 warmup_steps: int = 0, values: str = "float32", clip_norm: float | None = None):
        super().__init__(min_compression_rate, start_step)
        for name, value in [("ratio", ratio)] + [(f"warmup[{i}]", r) for i, r in enumerate(warmup)]:
            if not 0 < value <= 1:
                raise ValueError(f"{name}={value!r}: use a fraction in (0, 1], e.g. 0.01 for 1%")
        if warmup:
            validators.positive_int(warmup_steps, "warmup_steps")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum={momentum!r}: use a value in [0, 1)")
        if momentum and not error_feedback:
            raise ValueError("momentum correction needs error_feedback=True")
        if values not in ("float32", "float16"):
            raise ValueError(f"values={values!r}: use 'float32' or 'float16'")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm={clip_norm!r}: use a positive norm, or None not to clip")
        self.ratio, self.error_feedback, self.momentum = ratio, error_feedback, momentum
        self.warmup, self.warmup_steps, self.values = tuple(warmup), warmup_steps, values
        self.clip_norm = clip_norm

    @classmethod
    def from_argument(cls, argument, **options) -> "TopK":
        """``topk:RATIO``; ``topk`` is 1%."""
        return cls(**({"ratio": float(argument)} if argument else {}), **options)

    def stage_at(self, step: int) -> float:
        """The ratio sent at optimizer `step`: a warm-up ratio, then `ratio`."""
        index = (step - self.start_step) // self.warmup_steps if self.warmup else 0
        return self.warmup[index] if index < len(self.warmup) else self.ratio

    def last_stage_step(self) -> int:
        return self.start_step + len(self.warmup) * self.warmup_steps

    def _k(self, shape) -> int:
        ratio = self.stage if self.stage is not None else self.ratio
        return max(1, math.ceil(ratio * numel(shape)))

    def payload_bytes(self, shape) -> int:
        value_bytes = 2 if self.values == "float16" else 4
        return (value_bytes + 4) * self._k(shape)  # value + int32 index

    def route(self, shape, replicas):
        """All-gather while N payloads weigh less than twice the dense gradient (each replica
        receives N - 1 payloads, against 2 (N - 1) / N of the dense bytes in a ring all-reduce);
        else the entries, scattered into a dense float32 gradient, are all-reduced.

        Examples:
            >>> [TopK(0.25).route((1000, 1000), n) for n in (2, 8)]
            [('all_gather', 2000000), ('all_reduce', 4000000)]
            >>> [TopK(0.01).route((1000, 1000), n)[0] for n in (64, 128)]
            ['all_gather', 'all_reduce']
        """
        payload = self.payload_bytes(shape)
        if replicas * payload < 2 * 4 * numel(shape):
            return "all_gather", payload
        return "all_reduce", 4 * numel(shape)

    def state_spec(self, shape):
        spec = {"residual": (tuple(shape), "zeros")} if self.error_feedback else {}
        if self.momentum:
            spec["velocity"] = (tuple(shape), "zeros")
        return spec

    def compress(self, grad, state, replicas):
        import tensorflow as tf

        if self.clip_norm is not None:  # DGC's local clipping, the threshold scaled by N^-1/2
            grad = tf.clip_by_norm(grad, self.clip_norm / math.sqrt(replicas))
        flat = tf.reshape(grad, [-1])
        if self.momentum:
            velocity = self.momentum * tf.reshape(state["velocity"].value, [-1]) + flat
            flat = velocity
        if self.error_feedback:
            flat = flat + tf.reshape(state["residual"].value, [-1])
        _, indices = tf.math.top_k(tf.abs(flat), k=self._k(grad.shape))
        values = tf.cast(tf.gather(flat, indices), self.values)
        if self.error_feedback:  # what was not sent, float16 rounding included, is kept
            sent = tf.scatter_nd(indices[:, None], tf.cast(values, flat.dtype), tf.shape(flat))
            state["residual"].assign(tf.reshape(flat - sent, grad.shape))
            if self.momentum:  # factor masking: no momentum left where the update was sent
                unsent = 1.0 - tf.scatter_nd(indices[:, None], tf.ones_like(indices, flat.dtype),
                                             tf.shape(flat))
                state["velocity"].assign(tf.reshape(velocity * unsent, grad.shape))
        collective = self.route(grad.shape, replicas)[0]  # meta: decompress reads it back
        if collective == "all_reduce":
            return (_scatter(values, indices, grad),), collective
        return (values, tf.cast(indices, tf.int32)), collective

    def decompress(self, payload, meta, grad, state, replicas):
        import tensorflow as tf

        if meta == "all_reduce":
            return tf.reshape(payload[0], grad.shape)  # the replicas' entries, summed densely
        values, indices = payload  # every replica's entries, concatenated
        return tf.reshape(_scatter(values, indices, grad), grad.shape)


def _scatter(values, indices, grad):
    """The flat dense gradient holding `values` at `indices` (duplicates added)."""
    import tensorflow as tf

    return tf.scatter_nd(indices[:, None], tf.cast(values, grad.dtype), [numel(grad.shape)])
