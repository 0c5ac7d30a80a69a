"""`kdist.barrier()`: wait until every worker of the cluster has reached the same point.

Under MultiWorkerMirrored, `model.save("m.keras")` is written by the chief while the other workers
go on; a worker that then loads the file can get there before the chief has finished writing it.
Put a barrier between the save and the load:

>>> import kdist, keras
>>> with kdist.scope():
...     model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> kdist.barrier()          # one process: returns at once; under MWMS, once every worker is here
"""

from __future__ import annotations

from kdist.strategies import is_multi_worker, registry


def barrier(strategy=None) -> None:
    """Returns when every worker of `strategy` (default: the current kdist strategy) has called it.

    Multi-worker: one scalar all-reduce, so every worker must call it, in the same order as its
    other collectives (as with any collective). One process, or the chief of parameter-server
    training (the only task that runs the user's code): returns at once.
    """
    strategy = strategy if strategy is not None else registry.current()
    if not is_multi_worker(strategy):
        return
    import tensorflow as tf

    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
