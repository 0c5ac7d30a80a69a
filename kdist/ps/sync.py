"""How parameter-server updates synchronise: `kdist.scope(ps_sync="async" | "ksync:K" | "kbatch:K" |
"stale:S")`, bound to the models compiled inside the block.

- ``async`` (default): each worker applies its gradient as soon as it has it (asynchronous SGD).
- ``ksync:K``: an update applies the mean of the first K gradients computed on the current
  variables by K different workers; a gradient computed on variables that have been updated since
  (the slower workers' gradients of that step), or a second one from a worker already counted in
  this update, is dropped. ``ksync:N`` with N workers is synchronous SGD.
- ``kbatch:K``: an update applies the mean of the next K gradients, from any workers, however old.
- ``stale:S``: asynchronous, but a gradient computed on variables more than S updates old is
  dropped. Dropped rather than waited for: a worker waiting on the ps would hold a step that the
  coordinator cannot give to another worker, and the worker's next step reads fresh variables.

Everything lives on the parameter servers: one accumulator per trainable variable, next to it, and
counters on ps 0, all changed inside one `tf.CriticalSection` (a mutex on ps 0). A worker's step
reads the version (updates applied so far) before it reads the variables, computes its gradient,
then in the critical section accepts it into the accumulators (or drops it) and, once K gradients
are in, applies their mean with the model's optimizer, clears the accumulators and counts the
version up. The chief only schedules steps, as in asynchronous training.

A step is a batch read and a gradient computed, as before; an update is one optimizer step
(`optimizer.iterations`). Training metrics count every step's batch, dropped gradients included.
Per epoch, the logs get ``ps_updates``, ``ps_gradients_applied``, ``ps_gradients_dropped`` and
``ps_staleness_mean`` (of the applied gradients); `stats(model)` adds the staleness histogram and
the gradients each worker contributed. Accumulated gradients of an unfinished update are not part
of a checkpoint: a resumed job starts that update again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref

from kdist import validators
from kdist import model_state as states

KINDS = ("async", "ksync", "kbatch", "stale")
HISTOGRAM_BUCKETS = 8  # staleness 0..6, and 7 or more


@dataclasses.dataclass(frozen=True)
class SyncMode:
    """A parsed `ps_sync` value: `kind` and its number (K, or S for stale)."""

    kind: str
    number: int = 0

    @classmethod
    def parse(cls, text) -> "SyncMode":
        """'ksync:2' -> SyncMode('ksync', 2); a bad value raises ValueError naming the fix."""
        kind, _, number = str(text).partition(":")
        usage = ("use 'async', 'ksync:K' (the first K fresh gradients per update), 'kbatch:K' (any "
                 "K gradients per update) or 'stale:S' (drop gradients more than S updates old)")
        if kind not in KINDS or (kind == "async") != (number == ""):
            raise ValueError(f"ps_sync={text!r}: {usage}")
        if kind == "async":
            return cls(kind)
        if not validators.is_digits(number) or (kind != "stale" and int(number) < 1):
            raise ValueError(f"ps_sync={text!r}: {kind} needs a whole number "
                             f"{'>= 0' if kind == 'stale' else '>= 1'} after the colon; {usage}")
        return cls(kind, int(number))

    @property
    def quorum(self) -> int:
        """Gradients per update."""
        return self.number if self.kind in ("ksync", "kbatch") else 1

    def accepts(self, staleness, counted):
        """Whether a gradient `staleness` updates old goes into the accumulators (a tensor);
        `counted`: its worker already has a gradient in this update."""
        import tensorflow as tf

        if self.kind == "ksync":
            return tf.logical_and(tf.equal(staleness, 0), tf.logical_not(counted))
        if self.kind == "stale":
            return tf.less_equal(staleness, self.number)
        return tf.constant(True)

    def __str__(self):
        return self.kind if self.kind == "async" else f"{self.kind}:{self.number}"


def mode_of(model) -> SyncMode:
    """The synchronisation a model was compiled with (`kdist.scope(ps_sync=...)`)."""
    options = states.of(model).options
    return options.ps_sync if options is not None else SyncMode("async")


# The optimizers whose `apply_gradients` hands its gradients over instead of applying them (a
# worker's step), and those applying an update's mean on the ps (no exchange among replicas):
# kdist's hooks at the seam read them (`kdist.wiring.keras_hooks`).
_capturing: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_applying: "weakref.WeakSet" = weakref.WeakSet()


@contextlib.contextmanager
def capturing(optimizer, into: list):
    """`optimizer.apply_gradients(pairs)` in this block adds `pairs` to `into` instead."""
    _capturing[optimizer] = into
    try:
        yield into
    finally:
        del _capturing[optimizer]


def capturing_into(optimizer) -> list | None:
    return _capturing.get(optimizer)


@contextlib.contextmanager
def applying_update(optimizer):
    """`optimizer` applies an update's mean gradient in this block: one replica, no exchange."""
    _applying.add(optimizer)
    try:
        yield
    finally:
        _applying.discard(optimizer)


def applying(optimizer) -> bool:
    return optimizer in _applying


class SyncState:
    """The accumulators, counters and lock of one model on the parameter servers."""

    def __init__(self, model, mode: SyncMode, workers: int):
        import tensorflow as tf

        self.mode, self.model = mode, model
        strategy = model.distribute_strategy
        self.variables = list(model.trainable_variables)
        with strategy.scope():
            self.accumulators = []
            for variable in self.variables:
                with strategy.extended.colocate_vars_with(variable.value):
                    self.accumulators.append(tf.Variable(
                        tf.zeros(variable.shape, variable.dtype), trainable=False,
                        name=f"{variable.path.replace('/', '_')}_kdist_accumulator"))

            def counter(name, shape=()):
                return tf.Variable(tf.zeros(shape, tf.int64), trainable=False,
                                   name=f"kdist_sync_{name}")

            self.version, self.pending = counter("version"), counter("pending")
            self.updates, self.dropped = counter("updates"), counter("dropped")
            self.histogram = counter("staleness_histogram", (HISTOGRAM_BUCKETS,))
            self.per_worker = counter("per_worker", (workers,))
            self.in_update = counter("in_update", (workers,))  # workers counted in this update
        self.lock_device = self.version.device  # ps 0
        with tf.device(self.lock_device):
            self.lock = tf.CriticalSection(name="kdist_ps_sync")

    def step(self, iterator):
        """One step of the scheduled function: the model's own `train_step` on the worker's
        replica computes the gradient (its optimizer update held back), then `submit`."""
        strategy = self.model.distribute_strategy
        logs, read_at, gradients = strategy.run(self._gradients, args=(next(iterator),))
        local = strategy.experimental_local_results
        self.submit([local(g)[0] for g in gradients], local(read_at)[0])
        return logs

    def _gradients(self, data):
        """(logs, version read before any variable, gradients). In the replica's own thread: the
        control dependency reaches the variable reads of `train_step` only from here."""
        import tensorflow as tf

        read_at = self.version.read_value()
        with capturing(self.model.optimizer, []) as captured, \
                tf.control_dependencies([read_at]):
            logs = self.model.train_step(data)
        by_variable = {id(v): g for g, v in captured}
        return logs, read_at, [tf.zeros(v.shape, v.dtype) if by_variable.get(id(v)) is None
                               else tf.convert_to_tensor(by_variable[id(v)])
                               for v in self.variables]

    def _apply(self, means):
        """The optimizer's update with the update's mean gradient: one replica per worker, so
        Keras's all-reduce of it over the worker's replicas is left out."""
        import tensorflow as tf

        optimizer = self.model.optimizer
        with applying_update(optimizer), tf.device(self.lock_device):  # not the worker's
            optimizer.apply_gradients(zip(means, self.variables))

    def submit(self, gradients, read_at):
        """Accepts (or drops) one gradient and applies the update when the quorum is in, all in
        the critical section (cross-replica context: the optimizer runs through `strategy.run`)."""
        import tensorflow as tf

        # Everything the critical section reads from the worker is first copied to the lock's ps,
        # and the section runs there: the lock is taken only once these copies are in, and from
        # then on nothing waits for the worker. Without it, a worker stopped while holding the
        # lock (its tensors still to be fetched, or the branches, the mean and the optimizer's
        # arithmetic on it, the default device) held every update: ksync:2 made under 2 updates
        # in 5 s in 4-7 of 12 SIGSTOPs of one worker of three; with it, 2 of 12. The rest is
        # TensorFlow's runtime: under async, too, a read of a ps variable waited for that worker.
        with tf.device(self.lock_device):
            worker = tf.identity(tf.cast(
                tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64))
            read_at = tf.identity(read_at)
            gradients = [tf.identity(g) for g in gradients]

        def accept(staleness):
            added = [acc.assign_add(g) for acc, g in zip(self.accumulators, gradients)]
            bucket = tf.minimum(staleness, HISTOGRAM_BUCKETS - 1)
            with tf.control_dependencies(added):
                return tf.group(
                    self.pending.assign_add(1),
                    self.histogram.scatter_nd_add([[bucket]], [1]),
                    self.per_worker.scatter_nd_add([[worker]], [1]),
                    self.in_update.scatter_nd_update([[worker]], [1]))

        def update():
            count = self.pending.read_value()
            means = [acc.read_value() / tf.cast(count, acc.dtype) for acc in self.accumulators]
            self.model.distribute_strategy.run(self._apply, args=(means,))
            # Reading each variable after its update orders the version after every update: a
            # step that reads the new version reads the new variables.
            updated = [v.value.read_value() for v in self.variables]
            with tf.control_dependencies(updated):
                return tf.group(*[acc.assign(tf.zeros_like(acc)) for acc in self.accumulators],
                                self.pending.assign(0), self.in_update.assign(
                                    tf.zeros_like(self.in_update)), self.version.assign_add(1),
                                self.updates.assign_add(1))

        def critical():
            staleness = self.version.read_value() - read_at
            counted = tf.gather(self.in_update.read_value(), worker) > 0
            accepted = tf.cond(self.mode.accepts(staleness, counted),
                               lambda: _after(accept(staleness), True),
                               lambda: _after(self.dropped.assign_add(1), False))
            with tf.control_dependencies([accepted]):
                ready = tf.logical_and(accepted, self.pending.read_value() >= self.mode.quorum)
            return tf.cond(ready, lambda: _after(update(), True), lambda: tf.constant(False))

        with tf.device(self.lock_device):
            return self.lock.execute(critical, exclusive_resource_access=False)

    def reset_stats(self) -> None:
        for counter in (self.updates, self.dropped, self.histogram, self.per_worker):
            counter.assign(counter.numpy() * 0)

    def logs(self) -> dict:
        """The epoch's figures, for the epoch logs."""
        histogram = self.histogram.numpy()
        applied = int(histogram.sum())
        mean = float((histogram * range(HISTOGRAM_BUCKETS)).sum() / applied) if applied else 0.0
        return {"ps_updates": float(self.updates.numpy()), "ps_gradients_applied": float(applied),
                "ps_gradients_dropped": float(self.dropped.numpy()), "ps_staleness_mean": mean}

    def stats(self) -> dict:
        return {"mode": str(self.mode), **self.logs(),
                "staleness_histogram": self.histogram.numpy().tolist(),
                "gradients_per_worker": self.per_worker.numpy().tolist()}


def stats(model) -> dict:
    """The last epoch's synchronisation figures of a model trained under ParameterServerStrategy
    with `ps_sync` other than async: mode, updates, gradients applied and dropped, mean
    staleness, the staleness histogram (buckets 0..6 and 7+) and the gradients each worker
    contributed."""
    state = states.of(model).sync
    if state is None:
        raise ValueError("no synchronisation figures: the model was not trained by kdist under "
                         "ParameterServerStrategy with kdist.scope(ps_sync=...) other than 'async'")
    return state.stats()


def _after(operation, value: bool):
    """`value` as a tensor that exists only once `operation` has run (a tf.cond branch's output)."""
    import tensorflow as tf

    with tf.control_dependencies([operation]):
        return tf.constant(value)
