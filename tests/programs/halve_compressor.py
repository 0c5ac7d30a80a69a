"""A compressor added the way the registry says: this one file, and one line in
`kdist.compression.registry.COMPRESSORS` (which tests/test_compression.py adds at run time).
bfloat16 by hand, with BF16's arithmetic, so that training with it equals training with BF16."""

import tensorflow as tf

from kdist.compression import Compressor


class Halve(Compressor):
    def __init__(self, min_compression_rate: float = 1.0, start_step: int = 0):
        super().__init__(min_compression_rate, start_step)

    def should_compress(self, shape) -> bool:
        return True

    def compress(self, grad, state, replicas):
        return (tf.cast(grad / replicas, tf.bfloat16),), None

    def decompress(self, payload, meta, grad, state, replicas):
        return tf.cast(payload[0], grad.dtype) * replicas

    def payload_bytes(self, shape) -> int:
        return 2 * int(tf.TensorShape(shape).num_elements())
