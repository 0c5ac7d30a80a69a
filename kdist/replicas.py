"""`kdist.check_replicas(model)`: do every replica and every worker hold the same variables?

Synchronous data parallelism keeps one copy of each variable per replica and gives every copy the
same update, so the copies stay equal bit for bit. When something updates a copy on its own (a
layer that assigns a variable from its replica's data, a custom step that skips the all-reduce),
the copies drift apart silently: the saved model and `evaluate` then depend on which replica is
read. The check compares a checksum of every variable across the replicas and workers with one
small collective (an all-gather of two integers per variable); a mismatch names the variable, the
replicas (and their tasks) and the largest difference between their copies.

`fit` runs it at the end of every epoch for a model trained on several synchronous replicas
(Mirrored, MultiWorkerMirrored): an error by default, a warning with
``kdist.scope(check_replicas="warn")``, nothing with ``"off"``. Variables that are per replica
by design (metrics, compression residuals, Keras's gradient accumulators) are not compared.

>>> import kdist, keras
>>> with kdist.scope():
...     model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> kdist.check_replicas(model)          # one replica here: nothing to compare
[]
"""

from __future__ import annotations

import dataclasses
import logging

import keras

from kdist.exchange import host_rows
from kdist.keras_seam import keras_internals, tf_internals
from kdist.strategies import cluster_of, is_multi_worker, is_parameter_server

logger = logging.getLogger("kdist")
MODES = ("error", "warn", "off")


@dataclasses.dataclass(frozen=True)
class Difference:
    """One variable whose copies differ: its path, the replicas (with their tasks or devices)
    that hold a copy unlike replica 0's, and the largest absolute difference from it."""

    variable: str
    replicas: tuple[str, ...]
    largest: float

    def __str__(self):
        return (f"{self.variable}: replica 0 and {', '.join(self.replicas)} differ by up to "
                f"{self.largest:.3g}")


class ReplicasDisagree(RuntimeError):
    """The replicas' copies of some variables differ (see `differences`)."""

    def __init__(self, differences: list[Difference], when: str):
        self.differences = differences
        shown = "; ".join(str(d) for d in differences[:5])
        more = f" (and {len(differences) - 5} more)" if len(differences) > 5 else ""
        super().__init__(
            f"kdist: the replicas disagree {when}: {shown}{more}. In synchronous training every "
            "replica must hold the same variables. Usual causes: a layer that assigns a variable "
            "from its own replica's data (give it aggregation='mean'), a custom train_step that "
            "updates variables outside the optimizer, or workers that read different code. "
            "See docs/troubleshooting.md#my-replicas-disagree; to train on with a warning, "
            "kdist.scope(check_replicas='warn')")


def check_replicas(model, on_mismatch: str = "error", when: str = "now") -> list[Difference]:
    """Compares every variable of `model` and its optimizer across the replicas and workers.

    Returns the differences (empty when all agree); with ``on_mismatch="error"`` raises
    `ReplicasDisagree` instead, with ``"warn"`` logs them. Under MultiWorkerMirrored it is a
    collective: every worker must call it at the same point.
    """
    if on_mismatch not in MODES[:2]:
        raise ValueError(f"on_mismatch={on_mismatch!r}: use 'error' or 'warn'")
    strategy = model.distribute_strategy
    if not compares(strategy):
        return []
    variables = checked_variables(model)
    checksums = _checksums(strategy, variables)
    differing = [k for k in range(len(variables))
                 if (checksums[:, k] != checksums[0, k]).any()]
    if not differing:
        return []
    differences = _differences(strategy, [variables[k] for k in differing],
                               [checksums[:, k] for k in differing])
    if on_mismatch == "error":
        raise ReplicasDisagree(differences, when)
    logger.warning("%s", ReplicasDisagree(differences, when))
    return differences


class ReplicaCheck(keras.callbacks.Callback):
    """`check_replicas` at the end of every epoch (added by kdist to `fit`)."""

    def __init__(self, on_mismatch: str = "error"):
        super().__init__()
        self.on_mismatch = on_mismatch

    def on_epoch_end(self, epoch, logs=None):
        check_replicas(self.model, self.on_mismatch, when=f"after epoch {epoch + 1}")


def compares(strategy) -> bool:
    """Whether `strategy` keeps several synchronous copies of each variable."""
    return strategy.num_replicas_in_sync > 1 and not is_parameter_server(strategy)


def checked_variables(model) -> list:
    """The model's variables and its optimizer's that every replica must hold identically."""
    import tensorflow as tf

    optimizer = getattr(model, "optimizer", None)
    per_replica = set()
    candidates = list(model.weights)
    if optimizer is not None:
        per_replica = {id(v) for v in keras_internals.gradient_accumulators(optimizer)}
        candidates += list(optimizer.variables)
    seen, checked = set(), []
    for variable in candidates:
        on_read = getattr(variable.value, "synchronization", None) == \
            tf.VariableSynchronization.ON_READ
        if id(variable) in per_replica or id(variable) in seen or on_read:
            continue
        seen.add(id(variable))
        checked.append(variable)
    return checked


def _checksums(strategy, variables):
    """[replicas, variables, 2]: every replica's checksums of `variables`, computed from the
    host values of their copies and gathered over the workers (`kdist.exchange.host_rows`)."""
    import numpy as np

    local = tf_internals.replicas_per_worker(strategy)
    own = np.zeros([local, len(variables), 2], np.int64)
    for k, variable in enumerate(variables):
        copies = strategy.experimental_local_results(variable.value)
        for replica in range(local):  # a variable not mirrored: every replica reads its one copy
            own[replica, k] = _checksum(np.asarray(copies[replica % len(copies)]))
    rows = host_rows.per_worker(strategy, own.reshape(-1), "replica checksums")
    return rows.reshape(-1, len(variables), 2)


def _checksum(array):
    """Two position-weighted sums of the 16-bit halves of `array`'s 32-bit words: exact in int64
    (no overflow below 2^34 words), so equal copies give equal sums on every replica and worker
    whatever order the sums run in."""
    import numpy as np

    words = _words(np.ascontiguousarray(array).reshape(-1))
    weight = np.arange(words.size, dtype=np.int32) % 8191 + 1
    low, high = words & 0xFFFF, (words >> 16) & 0xFFFF  # each product below 2^29: int32
    return (low * weight).sum(dtype=np.int64), (high * weight).sum(dtype=np.int64)


def _words(flat):
    """`flat`'s bits as int32 words (bytes and 16-bit values one per word)."""
    import numpy as np

    if flat.dtype == np.bool_:
        return flat.astype(np.int32)
    size = flat.dtype.itemsize
    if size in (4, 8):
        return flat.view(np.int32)
    return flat.view(np.int16 if size == 2 else np.int8).astype(np.int32)


def _differences(strategy, variables, checksums) -> list[Difference]:
    """How far each replica's copy is from replica 0's, for the variables that differ (a second
    collective, on this error path only: an all-gather of those variables)."""
    import numpy as np
    import tensorflow as tf

    @tf.function(autograph=False)  # nothing to convert
    def gathered():
        def replica():
            context = tf.distribute.get_replica_context()
            return [context.all_gather(tf.cast(tf.reshape(v.value, [1, -1]), tf.float64), axis=0)
                    for v in variables]

        return strategy.run(replica)

    values = [np.asarray(v) for v in strategy.experimental_local_results(gathered())[0]]
    names = replica_names(strategy)
    found = []
    for variable, sums, copies in zip(variables, checksums, values):
        others = [r for r in range(len(sums)) if (sums[r] != sums[0]).any()]
        largest = max(float(np.abs(copies[r] - copies[0]).max()) for r in others)
        found.append(Difference(variable.path, tuple(names[r] for r in others), largest))
    return found


def replica_names(strategy) -> list[str]:
    """'replica R (task)' for each replica of a multi-worker strategy, 'replica R (device)'
    within one process."""
    replicas = strategy.num_replicas_in_sync
    if is_multi_worker(strategy):
        spec = cluster_of(strategy)
        tasks = [f"{t}:{i}" for t, i in spec.tasks() if t in ("chief", "worker")] \
            if spec is not None else []
        per_worker = tf_internals.replicas_per_worker(strategy)
        return [f"replica {r} ({tasks[r // per_worker] if r // per_worker < len(tasks) else '?'})"
                for r in range(replicas)]
    devices = strategy.extended.worker_devices
    return [f"replica {r} ({devices[r].split('/')[-1].replace('device:', '') if r < len(devices) else '?'})"
            for r in range(replicas)]
