"""The task `kdist.planner.measure.measure_host_cost` launches on two workers: each sums
`payload` bytes as kdist sums gradients (`Comm`: its TCP ring on CPU workers) and the chief writes
the median seconds to `out`. Run in the launched processes only (it imports TensorFlow).
"""

from __future__ import annotations

import json
import time

import kdist
from kdist.exchange.comm import Comm, tcp_ring


def task(payload: int, out: str, repeats: int = 20) -> None:
    """The median seconds of `repeats` all-reduces of `payload` bytes, written to `out`."""
    strategy = kdist.strategy("multi_worker")
    import tensorflow as tf

    values = tf.ones([payload // 4])
    ring = tcp_ring(strategy)

    @tf.function
    def all_reduce():  # as the gradients are summed: kdist's TCP ring on CPU workers
        context = tf.distribute.get_replica_context
        return strategy.run(lambda: Comm(context(), step=None, ring=ring)
                            .all_reduce_sum([values])[0])

    for _ in range(3):
        all_reduce()
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        float(strategy.experimental_local_results(all_reduce())[0][0])
        timings.append(time.perf_counter() - started)
    if kdist.cluster().is_chief:
        with open(out, "w") as f:
            json.dump({"seconds": sorted(timings)[len(timings) // 2]}, f)
