"""`per_worker(strategy, values, purpose)`: every worker's row of a few host values.

kdist's own between-epoch reports compare small NumPy vectors across the workers: the step
clock's figures (`kdist.steps`), the replicas' variable checksums (`kdist.check_replicas`). Where
kdist's TCP ring sums the gradients they ride it instead (`kdist.exchange.host_rows`). Each
purpose and length has one traced all-gather per strategy, kept for the strategy's life: a later
fit traces none (the step clock's summary traced its own in every fit, 40 ms of its first epoch).
Float64 values travel as their bits.

Two reports never share one traced collective: calls back to back would share its collective
keys, and a worker still receiving the first could be handed the second's (with one function of
any length, a 2-worker `kdist verify` saw its peer finish while it still waited in the first).

>>> import numpy as np, tensorflow as tf
>>> per_worker(tf.distribute.get_strategy(), np.array([1.5, 2.0]), "example").tolist()
[[1.5, 2.0]]
"""

from __future__ import annotations

from kdist import global_state
from kdist.keras_seam import tf_internals
from kdist.keras_seam.strategy_kinds import is_multi_worker


def per_worker(strategy, values, purpose: str):
    """[workers, n]: each worker's 1-D `values` (int64 or float64, the same length on every
    worker), in worker order, through the all-gather of `purpose` (a report's name). A
    collective under MultiWorkerMirrored: every worker calls it at the same point. Other
    strategies: this process's row alone."""
    import numpy as np

    values = checked(values)
    if not is_multi_worker(strategy):
        return values[None]
    gather = _gather(strategy, purpose, len(values))
    gathered = strategy.experimental_local_results(gather(values.view(np.int64)))[0]
    rows = gathered.numpy()  # one row per replica: each worker's replicas sent the same row
    per = tf_internals.replicas_per_worker(strategy)
    return rows[::per].view(values.dtype)


def checked(values):
    """`values` as a contiguous 1-D int64 or float64 array; another dtype is refused."""
    import numpy as np

    values = np.ascontiguousarray(values)
    if values.dtype not in (np.int64, np.float64) or values.ndim != 1:
        raise TypeError(f"per_worker: values of dtype {values.dtype} and shape {values.shape}; "
                        "pass a 1-D int64 or float64 array")
    return values


def _gather(strategy, purpose: str, length: int):
    """The strategy's all-gather of `purpose`'s int64 vectors of `length` (traced once)."""
    kept = global_state.of_strategy(strategy).host_gathers
    key = (purpose, length)
    if key not in kept:
        import tensorflow as tf

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([length], tf.int64)])
        def gather(values):
            def replica(values):
                return tf.distribute.get_replica_context().all_gather(values[None], axis=0)

            return strategy.run(replica, args=(values,))

        kept[key] = gather
    return kept[key]
