"""Proportional batches for uneven replicas: `kdist.scope(balance="measure")` or a list of shares.

Under Mirrored and MultiWorkerMirrored every replica normally gets an equal part of each global
batch, so the slowest device sets the step time. With `balance`, each replica gets a part in
proportion to its share (its speed), the global batch is unchanged, and each replica's gradient is
weighted by the examples it saw, so an update equals the plain global-batch update:

    sum_i b_i g_i / sum_i b_i   (b_i examples and mean gradient g_i of replica i)

- ``balance="measure"``: the first `fit` times each replica's forward and backward pass on a few
  equal batches (no collective inside the timed part, the replicas running side by side as they
  train), then splits in proportion to the measured throughput. The shares stay with the model.
- ``balance=[3, 1]``: fixed shares, one per replica in `replica_id_in_sync_group` order (worker by
  worker, then the worker's local devices); normalised to sum to 1.

Every replica reads the whole global batch from its worker's pipeline and keeps its slice, so every
worker's input must produce the same batches in the same order (as with TF's DATA auto-sharding:
no unseeded shuffle in a `tf.data` pipeline; Keras's NumPy input is fine). Metrics are unchanged:
Keras counts examples, not replicas. Validation, `evaluate` and `predict` split equally, as Keras does.

>>> import kdist, keras
>>> with kdist.scope(balance=[3, 1]):       # one replica here: a one-element list, or "measure"
...     pass
Traceback (most recent call last):
...
kdist.validators.UsageError: balance: [3, 1] gives 2 shares for 1 replica. Fix: give one share per replica (replica_id_in_sync_group order), or balance="measure"
"""

from kdist import model_state
from kdist.balance.shares import Balance
from kdist.balance.split import split_sizes


def shares_of(model) -> tuple[float, ...] | None:
    """The shares a model trains with (one per replica), or None: equal split, or not measured yet.

    >>> import keras
    >>> shares_of(keras.Sequential()) is None
    True
    """
    return model_state.of(model).shares


__all__ = ["Balance", "shares_of", "split_sizes"]
