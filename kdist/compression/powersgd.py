"""PowerSGD (Vogels et al., NeurIPS 2019): rank-r gradient approximation by one power iteration."""

from __future__ import annotations

from kdist import validators

import math

from kdist.compression.base import Compressor


def _matrix_shape(shape) -> tuple[int, int]:
    """A kernel as a matrix: all leading dimensions x the last (conv kernels flatten h*w*in)."""
    return int(math.prod(int(d) for d in shape[:-1])), int(shape[-1])


class PowerSGD(Compressor):
    """Sends two thin matrices, P (n x r) and Q (m x r), instead of each n x m gradient.

    Per step: P = M Q, all-reduce P, orthogonalise it, Q = M^T P, all-reduce Q; the summed
    gradient is approximated by P Q^T. Exact when the summed gradient has rank <= r.

    Args:
        rank: r.
        error_feedback: add what the approximation missed to the next step's gradient.
        warm_start: start each step's power iteration from the previous Q (better approximation
            at no cost); otherwise from a fresh random Q, the same on every replica.
        min_compression_rate: see `Compressor`.
        start_step: see `Compressor`.
        seed: seed of the initial random Q (identical on every replica).
    """

    def __init__(self, rank: int = 4, start_step: int = 0, min_compression_rate: float = 2.0,
                 error_feedback: bool = True, warm_start: bool = True, seed: int = 0):
        super().__init__(min_compression_rate, start_step)
        validators.positive_int(rank, "rank")
        self.rank, self.error_feedback, self.warm_start, self.seed = \
            rank, error_feedback, warm_start, seed

    @classmethod
    def from_argument(cls, argument, **options) -> "PowerSGD":
        """``powersgd:RANK``; ``powersgd`` is rank 4."""
        return cls(**({"rank": int(argument)} if argument else {}), **options)

    def should_compress(self, shape) -> bool:
        return len(shape) >= 2 and self.rank < min(_matrix_shape(shape)) and \
            super().should_compress(shape)

    def payload_bytes(self, shape) -> int:
        n, m = _matrix_shape(shape)
        return 4 * self.rank * (n + m)

    def state_spec(self, shape):
        import keras

        n, m = _matrix_shape(shape)
        spec = {"q": ((m, self.rank), keras.initializers.RandomNormal(seed=self.seed))}
        if self.error_feedback:
            spec["residual"] = (tuple(shape), "zeros")
        return spec

    def aggregate(self, grads, states, comm):
        import tensorflow as tf

        matrices = []
        for grad, state in zip(grads, states):
            if self.error_feedback:
                grad = grad + state["residual"].value
            matrices.append(tf.reshape(grad, _matrix_shape(grad.shape)))
        qs = [self._start_q(state, m.shape[1], comm) for state, m in zip(states, matrices)]
        ps = comm.all_reduce_sum([m @ q for m, q in zip(matrices, qs)])
        ps = [tf.linalg.qr(p)[0] for p in ps]  # orthonormal basis of the column space
        qs = comm.all_reduce_sum([tf.transpose(m) @ p for m, p in zip(matrices, ps)])
        out = []
        for grad, state, matrix, p, q in zip(grads, states, matrices, ps, qs):
            summed = p @ tf.transpose(q)
            if self.error_feedback:  # this replica's share of the sum is summed / replicas
                state["residual"].assign(tf.reshape(matrix - summed / comm.replicas, grad.shape))
            if self.warm_start:
                state["q"].assign(q)
            out.append(tf.reshape(summed, grad.shape))
        return out

    def _start_q(self, state, columns, comm):
        import tensorflow as tf

        if self.warm_start:
            return state["q"].value
        return tf.random.stateless_normal([columns, self.rank],
                                          seed=tf.stack([tf.constant(self.seed, tf.int64),
                                                         tf.cast(comm.step, tf.int64)]))
