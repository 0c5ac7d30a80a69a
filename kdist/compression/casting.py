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
        return (tf.cast(grad / replicas, self.wire_dtype),), None

    def decompress(self, payload, meta, grad, state, replicas):
        import tensorflow as tf

        return self._check(tf.cast(payload[0], grad.dtype)) * replicas

    def _check(self, summed):
        return summed


class FP16(_Cast):
    """float16 on the wire (2x less). A gradient too large for float16 (> 65504 after dividing by
    the number of replicas) raises an error instead of silently becoming inf: on every worker,
    since the sum it checks is every worker's."""

    wire_dtype = "float16"

    def _check(self, summed):
        import tensorflow as tf

        # One number to check: the sum of finite float16 values stays finite in float32, an
        # inf or a NaN does not (check_numerics over every element costs 25x more on CPU).
        checked = tf.debugging.check_numerics(
            tf.reduce_sum(summed),
            "kdist.compression.FP16: a gradient overflows float16 even after scaling by "
            "1/replicas; use BF16 (same range as float32) or clip gradients")
        with tf.control_dependencies([checked]):
            return tf.identity(summed)


class BF16(_Cast):
    """bfloat16 on the wire (2x less): float32's range, 8 bits of mantissa."""

    wire_dtype = "bfloat16"
