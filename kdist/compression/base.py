"""The compressor interface: per-variable state plus pure compress/decompress functions.

A compressor turns the gradients of one replica into a payload that a collective can sum or
gather, and the collective's result back into the summed gradient. kdist calls it inside the
optimizer, where Keras would all-reduce the gradients, for every tensor that `should_compress()`;
other tensors are all-reduced as they are.

To add one, subclass `Compressor` and implement `compress` / `decompress` (one collective round, like
PyTorch's comm hooks), or override `aggregate` for several rounds (see `PowerSGD`):

>>> import kdist, tensorflow as tf
>>> class Halve(kdist.compression.Compressor):        # a toy: bfloat16 by hand
...     def compress(self, grad, state, replicas):
...         return (tf.cast(grad, tf.bfloat16),), None
...     def decompress(self, payload, meta, grad, state, replicas):
...         return tf.cast(payload[0], grad.dtype)
...     def payload_bytes(self, shape):
...         return 2 * numel(shape)
>>> Halve().should_compress((1024, 1024))
True
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from kdist import validators
from kdist.exchange.comm import Comm


def numel(shape) -> int:
    """Elements of a tensor of `shape`."""
    return int(math.prod(int(d) for d in shape))


class Compressor:
    """Base class. Args shared by every compressor:

    min_compression_rate: tensors whose payload would not be at least this many times smaller
        than the plain float32 gradient are sent uncompressed (1-D tensors always are).
    start_step: optimizer steps sent uncompressed before compression starts (warm-up).
    """

    collective = "all_reduce"  # or "all_gather": how `compress`'s payload is combined

    @classmethod
    def from_argument(cls, argument: str | None, **options) -> "Compressor":
        """The compressor that ``name:argument`` names (`kdist.compression.registry`), `options`
        going to the constructor; a compressor whose name takes no argument is built from
        `options` alone."""
        if argument is not None:
            raise ValueError(f"{cls.__name__} takes no argument")
        return cls(**options)

    def __init__(self, min_compression_rate: float = 2.0, start_step: int = 0):
        if not min_compression_rate >= 1:
            raise ValueError(f"min_compression_rate={min_compression_rate!r}: use a number >= 1")
        validators.non_negative_int(start_step, "start_step")
        self.min_compression_rate = min_compression_rate
        self.start_step = start_step

    # -------------------------------------------------------------- stages
    stage = None  # the stage the next trace compresses for (set by kdist before tracing)

    def stage_at(self, step: int):
        """The compressor's setting at optimizer `step` (>= start_step), for compressors whose
        setting changes during training (a hashable value; each stage is traced once)."""
        return None

    def last_stage_step(self) -> int:
        """The first optimizer step from which `stage_at` no longer changes."""
        return self.start_step

    def enter_stage(self, stage) -> None:
        """Makes `stage` (a value of `stage_at`) what the next trace compresses for."""
        self.stage = stage

    # -------------------------------------------------------------- per tensor, pure functions
    def should_compress(self, shape: Sequence[int]) -> bool:
        if len(shape) < 2:
            return False
        return 4 * numel(shape) >= self.min_compression_rate * self.payload_bytes(shape)

    def state_spec(self, shape: Sequence[int]) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Per-variable state: name -> (shape, initializer). Kept per replica, checkpointed."""
        return {}

    def compress(self, grad, state: dict, replicas: int):
        """Returns (payload: tuple of tensors, meta) for one replica's gradient."""
        raise NotImplementedError

    def decompress(self, payload, meta, grad, state: dict, replicas: int):
        """Returns the summed gradient from the collective's result (`payload`)."""
        raise NotImplementedError

    def payload_bytes(self, shape: Sequence[int]) -> int:
        """Bytes this replica contributes to the collective for a gradient of `shape`."""
        raise NotImplementedError

    def route(self, shape: Sequence[int], replicas: int) -> tuple[str, int]:
        """The collective that combines a compressed gradient of `shape` among `replicas`, and the
        bytes this replica contributes to it: `collective` and `payload_bytes` unless a
        compressor chooses by size (`TopK`)."""
        return self.collective, self.payload_bytes(shape)

    # -------------------------------------------------------------- all tensors of a step
    def aggregate(self, grads: list, states: list[dict], comm: Comm) -> list:
        """Sums `grads` over the replicas: compress all, one batched collective per route
        (`route`), decompress all."""
        compressed = [self.compress(g, s, comm.replicas) for g, s in zip(grads, states)]
        routes = [self.route(g.shape, comm.replicas)[0] for g in grads]
        reduced = {}
        for collective, combine in (("all_reduce", comm.all_reduce_sum),
                                    ("all_gather", comm.all_gather)):
            positions = [k for k, r in enumerate(routes) if r == collective]
            results = iter(combine([t for k in positions for t in compressed[k][0]]))
            for k in positions:
                reduced[k] = tuple(next(results) for _ in compressed[k][0])
        return [self.decompress(reduced[k], meta, grad, state, comm.replicas)
                for k, ((_, meta), grad, state) in enumerate(zip(compressed, grads, states))]

    def settings(self) -> tuple:
        """The class and settings that make two compressors equal."""
        return type(self), tuple(sorted((k, v) for k, v in vars(self).items() if k != "stage"))

    def __eq__(self, other):
        """Compressors with the same class and settings are equal (the stage is not a setting)."""
        return isinstance(other, Compressor) and self.settings() == other.settings()

    def __hash__(self):
        return hash(self.settings())

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class NoCompression(Compressor):
    """Plain float32 all-reduce: bit for bit what Keras does without kdist."""

    def should_compress(self, shape) -> bool:
        return False

    def payload_bytes(self, shape) -> int:
        return 4 * numel(shape)
