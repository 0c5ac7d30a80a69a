"""`StepWatch`: the step clock and the hang watchdog around one `fit`, and at each epoch's end
the stragglers, measured.

`kdist.wiring.dispatch` adds it to `fit` under MultiWorkerMirrored (``kdist.scope(
watch_steps=False)`` leaves it out). At the end of every epoch each worker's median step is split
into input wait, compute and communication (`kdist.steps.clock`); one small all-gather brings every
worker's figures to every worker, and the chief logs which worker is slowest and by how much, on
lines of its own once Keras's progress bar has ended its epoch's line (when the next epoch, or the
training, begins to end):

    kdist: epoch 2: slowest worker:1, its compute 7.35x the fastest's (worker:0)
    kdist:   worker:1 input 16.5 ms, compute 94.6 ms, all-reduce 80.4 ms, step 214.4 ms
    kdist:   worker:0 input 19.8 ms, compute 12.9 ms, all-reduce 143.0 ms, step 211.6 ms

When no worker's compute stands out (within 25% or 1 ms of the fastest's), one line says so:

    kdist: epoch 3: no straggler (compute 12.1-12.9 ms, step 40.2 ms)

`fit(verbose=0)` silences them. The user's logs (History, the progress bar, CSVLogger,
TensorBoard) get nothing; the last epoch's `Stragglers` stay on the callback (`StepWatch.last`).
"""

from __future__ import annotations

import logging
import math

import keras

from kdist.steps import clock as clocks
from kdist.steps.watchdog import CoordinationStore, Watchdog
from kdist.strategies import gather

logger = logging.getLogger("kdist")
SPLIT = ("input", "compute", "comm", "step")
EVEN_RATIO, EVEN_SECONDS = 1.25, 1e-3  # a slowest worker's compute closer to the fastest's: even


class StepWatch(keras.callbacks.Callback):
    """Times every step, watches for hangs, and summarises the workers at each epoch's end."""

    def __init__(self, task: str, tasks: list[str], timeout: float | None, action: str,
                 multi_worker: bool, per_worker=gather.per_worker):
        """`per_worker(strategy, values, purpose)` gathers every worker's figures (TensorFlow's
        all-gather by default; `kdist.wiring` hands it the one over kdist's ring)."""
        super().__init__()
        self.task, self.tasks, self.multi_worker = task, tasks, multi_worker
        self._per_worker = per_worker
        self.timeout, self.action = timeout, action
        self.clock = None
        self.watchdog = None
        self._epochs = 0
        self.last: Stragglers | None = None  # the last epoch's figures
        self._unsaid: list[str] = []  # the chief's lines, said once the progress bar's ended

    def on_train_begin(self, logs=None):
        self.clock = clocks.StepClock(clocks.stamps())
        clocks.watching(True)
        store = CoordinationStore() if self.multi_worker else None
        self.watchdog = Watchdog(self.clock, self.task, self.tasks, self.timeout, self.action,
                                 store)
        self.watchdog.start()

    def on_epoch_begin(self, epoch, logs=None):
        self._say()

    def on_train_batch_begin(self, batch, logs=None):
        self.clock.begin()

    def on_train_batch_end(self, batch, logs=None):
        self.clock.end()

    def on_epoch_end(self, epoch, logs=None):
        medians = self.clock.epoch_medians(skip=1 if self._epochs == 0 else 0)  # tracing
        self._epochs += 1
        if not self.multi_worker or "compute" not in medians:
            return
        figures = self._gathered([medians.get(key, math.nan) for key in SPLIT])
        self.last = Stragglers(epoch, self.tasks, figures)
        if self.task == self.tasks[0] and self.params.get("verbose", 1) != 0:
            self._unsaid = self.last.lines()

    def _say(self) -> None:
        for line in self._unsaid:
            logger.info("%s", line)
        self._unsaid = []

    def on_train_end(self, logs=None):
        self._say()
        clocks.watching(False)
        if self.watchdog is not None:
            self.watchdog.stop()

    def _gathered(self, figures: list[float]) -> list[list[float]]:
        """Every worker's figures, in worker order (a collective: every worker calls it)."""
        import numpy as np

        rows = self._per_worker(self.model.distribute_strategy, np.array(figures, np.float64),
                                "step figures")
        return rows.tolist()


class Stragglers:
    """One epoch's median step split on every worker, and the slowest by its compute (a worker's
    own forward and backward pass; input and communication include the time each waits for the
    others).

    >>> s = Stragglers(0, ["worker:0", "worker:1"],
    ...                [[0.004, 0.012, 0.012, 0.0246], [0.004, 0.0235, 0.0004, 0.0246]])
    >>> s.slowest, round(s.ratio, 2)
    (1, 1.96)
    >>> print("\\n".join(s.lines()))
    kdist: epoch 1: slowest worker:1, its compute 1.96x the fastest's (worker:0)
    kdist:   worker:1 input 4.0 ms, compute 23.5 ms, all-reduce 0.4 ms, step 24.6 ms
    kdist:   worker:0 input 4.0 ms, compute 12.0 ms, all-reduce 12.0 ms, step 24.6 ms
    """

    def __init__(self, epoch: int, tasks: list[str], figures: list[list[float]]):
        self.epoch, self.tasks, self.figures = epoch, tasks, figures
        compute = [f[1] for f in figures]
        self.slowest = max(range(len(compute)), key=compute.__getitem__)
        self.fastest = min(range(len(compute)), key=compute.__getitem__)
        self.ratio = float(compute[self.slowest] / compute[self.fastest]) \
            if compute[self.fastest] > 0 else math.inf

    def lines(self) -> list[str]:
        """A headline, then the slowest and the fastest worker's split; one line when no worker
        stands out.

        >>> print(*Stragglers(2, ["worker:0", "worker:1"], [[0.004, 0.0001, 0.002, 0.0121],
        ...                                                 [0.004, 0.0002, 0.003, 0.0124]]).lines())
        kdist: epoch 3: no straggler (compute 0.1-0.2 ms, step 12.4 ms)
        """
        compute = [f[1] for f in self.figures]
        if self.ratio < EVEN_RATIO or compute[self.slowest] - compute[self.fastest] < EVEN_SECONDS:
            return [f"kdist: epoch {self.epoch + 1}: no straggler (compute "
                    f"{compute[self.fastest] * 1e3:.1f}-{compute[self.slowest] * 1e3:.1f} ms, "
                    f"step {max(f[3] for f in self.figures) * 1e3:.1f} ms)"]
        head = (f"kdist: epoch {self.epoch + 1}: slowest {self.tasks[self.slowest]}, its compute "
                f"{self.ratio:.2f}x the fastest's ({self.tasks[self.fastest]})")
        return [head] + [f"kdist:   {self.tasks[k]} input {f[0] * 1e3:.1f} ms, compute "
                         f"{f[1] * 1e3:.1f} ms, all-reduce {f[2] * 1e3:.1f} ms, step "
                         f"{f[3] * 1e3:.1f} ms" for k in dict.fromkeys((self.slowest, self.fastest))
                         for f in [self.figures[k]]]
