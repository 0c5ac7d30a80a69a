"""Half-precision all-reduce: FP16 and BF16 (Horovod's fp16 compression, PyTorch's fp16/bf16 hooks)."""

from __future__ import annotations

from kdist.compression.base import Compressor, numel


class _Cast(Compressor):
    wire_dtype = None

    def __init__(self, min_compression_rate: float = 1.0, start_step: int = 0):
        super().__init__(min_compression_rate, start_step)

    def should_compress(self, shape) -> bool:  # halves every tensor, 1-D ones included
        return True

    def payload_bytes(self, shape) -> int:
        return 2 * numel(shape)

    def compress(self, grad, state, replicas):
        import tensorflow as tf

        # Scale before summing: the sum of n scaled values fits wherever their mean does.
        payload = tf.cast(grad / replicas, self.wire_dtype)
        return (self._check(payload),), None

    def decompress(self, payload, meta, grad, state, replicas):
        import tensorflow as tf

        return tf.cast(payload[0], grad.dtype) * replicas

    def _check(self, payload):
        return payload


class FP16(_Cast):
    """float16 on the wire (2x less). A gradient too large for float16 (> 65504 after dividing by
    the number of replicas) raises an error instead of silently becoming inf."""

    wire_dtype = "float16"

    def _check(self, payload):
        import tensorflow as tf

        return tf.debugging.check_numerics(
            payload, "kdist.compression.FP16: a gradient overflows float16 even after scaling by "
                     "1/replicas; use BF16 (same range as float32) or clip gradients")


class BF16(_Cast):
    """bfloat16 on the wire (2x less): float32's range, 8 bits of mantissa."""

    wire_dtype = "bfloat16"
