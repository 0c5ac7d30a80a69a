"""`per_worker(strategy, values)`: every worker's row of a few host values, in worker order.

kdist's own between-epoch reports compare small NumPy vectors across the workers: the step
clock's figures (`kdist.steps`), the replicas' variable checksums (`kdist.check_replicas`). They
share one traced all-gather per strategy, of int64 vectors of any length: tracing one costs
about 50 ms of a worker's first epoch (each report traced its own before), and a later fit
traces none. Float64 values travel as their bits.

>>> import numpy as np, tensorflow as tf
>>> per_worker(tf.distribute.get_strategy(), np.array([1.5, 2.0])).tolist()
[[1.5, 2.0]]
"""

from __future__ import annotations

from kdist import global_state
from kdist.keras_seam import tf_internals
from kdist.keras_seam.strategy_kinds import is_multi_worker


def per_worker(strategy, values):
    """[workers, n]: each worker's 1-D `values` (int64 or float64, the same length on every
    worker), in worker order. A collective under MultiWorkerMirrored: every worker calls it at
    the same point. Other strategies: this process's row alone."""
    import numpy as np

    values = np.ascontiguousarray(values)
    if values.dtype not in (np.int64, np.float64):
        raise TypeError(f"per_worker: values of dtype {values.dtype}; pass int64 or float64")
    if not is_multi_worker(strategy):
        return values[None]
    gathered = strategy.experimental_local_results(_gather(strategy)(values.view(np.int64)))[0]
    rows = gathered.numpy()  # one row per replica: each worker's replicas sent the same row
    per = max(1, strategy.num_replicas_in_sync // max(1, tf_internals.num_workers(strategy)))
    return rows[::per].view(values.dtype)


def _gather(strategy):
    """The strategy's all-gather of int64 vectors (traced once, for every length)."""
    kept = global_state.of_strategy(strategy)
    if kept.gather is None:
        import tensorflow as tf

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.int64)])
        def gather(values):
            def replica(values):
                return tf.distribute.get_replica_context().all_gather(values[None], axis=0)

            return strategy.run(replica, args=(values,))

        kept.gather = gather
    return kept.gather
