"""`Comm`: the collectives of one replica's gradient exchange, batched over lists of tensors.

Tensors on the replica's device are summed by the replica context (one all-reduce, as Keras does);
a model-parallel shard's tensor, living on another device of the worker (`kdist.layers.placement`),
is summed over the workers in that device's own collective group, so it is never copied to the
replica's device first: data parallel across workers, one group per model-parallel rank.

>>> import tensorflow as tf
>>> strategy = tf.distribute.get_strategy()
>>> summed = strategy.run(lambda: Comm(tf.distribute.get_replica_context(), step=0, ring=None)
...                       .all_reduce_sum([tf.ones(2)]))
>>> summed[0].numpy().tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import functools
import os
import weakref

from kdist import envvars, global_state, validators
from kdist.exchange import same_rows
from kdist.keras_seam import tf_internals
from kdist.layers import placement


class Comm:
    """The collectives of the current replica context, batched over lists of tensors, and the
    optimizer step they serve (`step`, a tensor). `ring` is the strategy's TCP ring where it sums
    the gradients (`tcp_ring`, handed down by the caller: CPU workers by default): the sums and
    all-gathers on the replica's device then go through it (`kdist.exchange.ring`); None:
    TensorFlow's collectives."""

    def __init__(self, replica_context, step, ring):
        self._context = replica_context
        self.replicas = replica_context.num_replicas_in_sync
        self.step = step
        self._ring = ring
        self._before_ring: list = []  # TensorFlow collectives every ring sum waits for

    def all_reduce_sum(self, tensors: list) -> list:
        """Sums `tensors` over the replicas; a model-parallel shard's tensor (off the replica's
        device) in its own device's group. An `IndexedSlices` (an Embedding's or `tf.gather`'s
        gradient) stays one: TensorFlow's collectives gather every replica's slices in replica
        order, as one device's gradient of the global batch holds them (repeated indices stay
        repeated, which an optimizer that squares the slices, Adam, tells apart from their sum).
        Slices whose indices are the same on every replica (`same_rows`: a position table's)
        are one device's rows once each: their values are summed, their indices kept."""
        import tensorflow as tf

        given = list(tensors)
        aligned = {k for k, t in enumerate(given) if same_rows.sparse_and_same_on_every_replica(t)}
        tensors = [t.values if k in aligned else t for k, t in enumerate(given)]
        summed = self._sum(tensors)
        return [tf.IndexedSlices(summed[k], given[k].indices, given[k].dense_shape)
                if k in aligned else summed[k] for k in range(len(given))]

    def _sum(self, tensors: list) -> list:
        import tensorflow as tf

        strategy = self._context.strategy
        sparse = [k for k, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
        groups = {device: [k for k in positions if k not in sparse]
                  for device, positions in placement.own_group_devices(tensors, strategy).items()}
        routed = {k for positions in groups.values() for k in positions} | set(sparse)
        rest = [k for k in range(len(tensors)) if k not in routed]
        gathered = functools.partial(self._context.all_reduce, tf.distribute.ReduceOp.SUM)
        summed = [None] * len(tensors)

        def reduce_into(positions, reduce):
            if positions:
                for k, value in zip(positions, reduce([tensors[k] for k in positions])):
                    summed[k] = value

        reduce_into(sparse, gathered)  # first: the ring's sums wait for these (_ring_sum)
        self._before_ring = [t for k in sparse for t in (summed[k].values, summed[k].indices)]
        reduce_into(rest, self._ring_sum if self._ring is not None else gathered)
        for device, positions in groups.items():
            reduce_into(positions, functools.partial(tf_internals.device_group_all_reduce,
                                                     device=device, strategy=strategy))
        return summed

    def _ring_sum(self, tensors: list) -> list:
        """`tensors` summed by the TCP ring: one collective per dtype, of its tensors as one
        buffer (not packed into one: no copy in, none out)."""
        def shaped(total, tensor):
            total.set_shape(tensor.shape)
            return total

        return self._over_ring(tensors, self._ring.all_reduce_sums, shaped)

    def all_gather(self, tensors: list) -> list:
        """Concatenates every replica's tensor along axis 0, in replica order: over the TCP
        ring where it sums the gradients (static shapes, the same on every worker: one replica
        each), else TensorFlow's all-gather."""
        import tensorflow as tf

        if not tensors:
            return []
        if self._ring is None:
            return self._context.all_gather(list(tensors), axis=0)
        size = self._ring.size
        return self._over_ring(list(tensors), self._ring.all_gather, lambda rows, tensor: (
            tf.reshape(rows, [size * tensor.shape[0], *tensor.shape[1:]])))

    def _over_ring(self, tensors: list, collective, finish) -> list:
        """`collective` (a ring method on NumPy arrays of one dtype) over `tensors`, one call per
        dtype, in the order they are issued on every worker; `finish(result, tensor)` shapes
        each result."""
        import tensorflow as tf

        results = [None] * len(tensors)
        by_dtype: dict = {}
        for k, tensor in enumerate(tensors):
            by_dtype.setdefault(tensor.dtype, []).append(k)
        for dtype, positions in by_dtype.items():
            # Every worker runs TensorFlow's collectives of this step before the ring's: one
            # order on every worker, so neither waits for a peer that waits for it.
            with tf.control_dependencies(self._ring.issued() + self._before_ring):
                outputs = tf.numpy_function(collective, [tensors[k] for k in positions],
                                            [dtype] * len(positions), stateful=True)
            self._ring.issue(outputs[0])
            for k, output in zip(positions, outputs):
                results[k] = finish(output, tensors[k])
        return results


def scalar_means(strategy, values: list, ring_allowed: bool = True) -> list:
    """The mean over the replicas of each float32 scalar in `values` (per-replica values, in
    cross-replica context: a step's logs), in one collective of them all: kdist's TCP ring where
    it summed this step's gradients in the same traced function (so that it runs after them, in
    the same order on every worker) and `ring_allowed` (the function runs one step: a loop of
    steps could start the next step's gradient sum before this one), else TensorFlow's
    all-reduce.

    >>> import tensorflow as tf
    >>> [float(m) for m in scalar_means(tf.distribute.get_strategy(), [tf.constant(2.0)])]
    [2.0]
    """
    import tensorflow as tf

    if not values:
        return []
    ring = tcp_ring(strategy)
    over_ring = ring_allowed and ring is not None and bool(ring.issued())

    def packed_sum(*scalars):
        context = tf.distribute.get_replica_context()
        packed = tf.stack(scalars)
        if over_ring:
            return Comm(context, step=None, ring=ring).all_reduce_sum([packed])[0]
        return context.all_reduce(tf.distribute.ReduceOp.SUM, packed)

    summed = strategy.run(packed_sum, args=tuple(values))
    means = strategy.experimental_local_results(summed)[0] / strategy.num_replicas_in_sync
    return tf.unstack(means, num=len(values))


class _LazyRing:
    """A strategy's TCP ring, connected on its first all-reduce (inside the first step, when
    every worker reaches it), through TensorFlow's coordination service.

    Every worker must issue the ring's collectives in one order, and a traced function runs ops
    that do not depend on each other in any order: each collective traced into a graph runs
    after the one traced into it before (`issued`, `issue`), whoever traced it (the gradients'
    exchange, then the step's logs)."""

    def __init__(self, rank: int, addresses: list[str], timeout: float, names: list[str]):
        self.rank, self.addresses, self.timeout, self.names = rank, addresses, timeout, names
        self.size = len(addresses)
        self._ring = None
        self._last = weakref.WeakKeyDictionary()  # graph -> its last ring collective

    def issued(self) -> list:
        """The ring collective last traced into the current graph (none when eager: ops run in
        the order Python issues them)."""
        import tensorflow as tf

        if tf.executing_eagerly():
            return []
        last = self._last.get(tf.compat.v1.get_default_graph())
        return [last] if last is not None else []

    def issue(self, collective) -> None:
        """`collective` is the last ring collective of the current graph."""
        import tensorflow as tf

        if not tf.executing_eagerly():
            self._last[tf.compat.v1.get_default_graph()] = collective

    def all_reduce_sums(self, *arrays):
        """The sums of `arrays` over the workers (`Ring.all_reduce_sums`), connecting first."""
        return self._connected().all_reduce_sums(list(arrays))

    def all_gather(self, *arrays):
        """Every worker's `arrays`, stacked in worker order (`Ring.all_gather`), connecting
        first."""
        return self._connected().all_gather(list(arrays))

    def _connected(self):
        if self._ring is None:
            from kdist.exchange.ring import Ring

            lookup = lambda key: tf_internals.get_job_key(key, int(self.timeout * 1000))  # noqa
            self._ring = Ring.connect(self.rank, self.addresses, tf_internals.set_job_key, lookup,
                                      self.timeout, secret=job_secret(self.rank, lookup),
                                      port=ring_port(), names=self.names,
                                      peek=tf_internals.peek_job_key)
        return self._ring


def job_secret(rank: int, lookup) -> bytes:
    """The secret every member of the job's TCP ring proves: ``KDIST_JOB_SECRET`` (set by
    `kdist launch`, by the rendered Kubernetes manifests from a Secret, or by hand), else one
    that rank 0 draws and shares through TensorFlow's coordination service (which anyone who can
    reach the job's gRPC port can read: set the variable where that matters)."""
    import secrets

    given = os.environ.get(envvars.JOB_SECRET, "")
    if given:
        return given.encode()
    key = "kdist/ring/secret"
    if rank == 0:
        tf_internals.set_job_key(key, secrets.token_hex(16))
    return lookup(key).encode()


def ring_port() -> int:
    """The port this worker's ring listens on: ``KDIST_RING_PORT`` (Kubernetes: the gRPC port
    plus one, which the NetworkPolicy admits), else any free one."""
    text = os.environ.get(envvars.RING_PORT, "").strip()
    if not text:
        return 0
    if not validators.is_digits(text) or not validators.port(int(text)):
        raise validators.UsageError(f"{envvars.RING_PORT}={text!r}", "is not a port",
                                    "use a port from 1 to 65535, or unset it (any free port)")
    return int(text)


def tcp_ring(strategy):
    """The TCP ring that sums `strategy`'s gradients where its plan says so
    (`StrategyPlan.gradients_over_tcp`: CPU workers by default, or ``all_reduce="tcp"``), else
    None."""
    kept = global_state.of_strategy(strategy)  # its plan, and its ring once made
    if kept.plan is None or not kept.plan.gradients_over_tcp:
        return None
    if kept.ring is None:
        rank, addresses, names = kept.plan.ring_members()
        kept.ring = _LazyRing(rank, addresses, kept.plan.options.ring_timeout, names)
    return kept.ring
