"""`per_worker(strategy, values, purpose)`: every worker's row of a few host values, over kdist's
TCP ring where it sums the gradients.

kdist's between-epoch reports (the stragglers' figures, the replicas' checksums) gather a small
NumPy vector from every worker. TensorFlow's all-gather (`kdist.strategies.gather`) costs little
once warm, but its first call traces a function and sets up a collective: about 120 ms each in the
first epoch of benchmarks/fit_wall.py's 2-worker fit, twice (measured by hand). Where the ring
already sums the gradients (`kdist.strategies.StrategyPlan.gradients_over_tcp`: CPU workers by
default), the rows ride its all-gather instead (`Ring.all_gather`: every row, bit for bit). Every
worker calls it at the same point of its program, as any collective.

>>> import numpy as np, tensorflow as tf
>>> per_worker(tf.distribute.get_strategy(), np.array([1.5, 2.0]), "example").tolist()
[[1.5, 2.0]]
"""

from __future__ import annotations

from kdist.exchange.comm import tcp_ring
from kdist.strategies import gather


def per_worker(strategy, values, purpose: str):
    """[workers, n]: each worker's 1-D `values` (int64 or float64, one length on every worker),
    in worker order; `purpose` names the report (TensorFlow's all-gather keeps one per report)."""
    import numpy as np

    ring = tcp_ring(strategy)
    if ring is None:
        return gather.per_worker(strategy, values, purpose)
    rows = ring.all_gather(gather.checked(values))[0]
    return np.array(rows)  # a copy: the ring reuses its results' buffers
