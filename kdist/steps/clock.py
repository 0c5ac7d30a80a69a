"""Where a training step's time goes on this worker: waiting for input, computing, communicating.

Three clock readings inside the traced step, each a `tf.py_function` that takes a sliver of what
it times as input (a data dependency, which Grappler keeps; `tf.timestamp()` under control
dependencies is run early by Grappler's dependency optimizer):

- ``input``: the batch has arrived (the start of `train_step`);
- ``gradients``: every gradient exists (where they are handed to the all-reduce);
- ``summed``: the all-reduce has returned.

With the Python-side readings at the step's start and end (`StepWatch`'s batch callbacks), a step
splits into input (start -> input: launching the step, the input pipeline, and under
MultiWorkerMirrored the workers agreeing that each has a next batch, which waits for the slowest),
compute (input -> gradients: this worker's own work), communication (gradients -> summed, the
waiting for slower workers included) and the rest (the update, metrics, logs). A reading runs once
what it takes is ready, give or take one op. With several replicas in a process, each reading is
the last replica's. `kdist.balance`'s measurement
reads the same clock (`reading`).

>>> clock = StepClock()
>>> clock.begin(); clock.mark("input"); clock.mark("gradients"); clock.mark("summed"); clock.end()
>>> sorted(clock.epoch_medians())
['comm', 'compute', 'input', 'step']
"""

from __future__ import annotations

import statistics
import threading
import time

MARKS = ("input", "gradients", "summed")


def reading(after, name: str | None = None, whole: bool = False):
    """A tensor of the host's monotonic clock (seconds), read once `after` (a tensor or a list
    of them) is computed; with `name`, the reading is also marked on the running fit's clock
    (`current()`, looked up when the step runs: a traced step serves every later fit). The
    reading takes one value of each tensor (cheap enough for every step); `whole` takes their
    sums instead, so the reading also waits for every value to be read once (what
    `kdist.balance`'s few timed passes use)."""
    import tensorflow as tf

    tensors = [t.values if isinstance(t, tf.IndexedSlices) else t
               for t in tf.nest.flatten(after) if t is not None]
    numeric = [t for t in tensors
               if (t.dtype.is_floating or t.dtype.is_integer) and t.shape.num_elements() != 0]
    sliver = [tf.reshape(tf.reduce_sum(tf.cast(t, tf.float64)), [1]) if whole else
              tf.cast(tf.reshape(t, [-1])[:1], tf.float64) for t in numeric]
    probe = tf.concat(sliver, axis=0) if sliver else tf.zeros([1], tf.float64)

    def read(_):
        now = time.perf_counter()
        clock = _current
        if name is not None and clock is not None:
            clock.mark(name, now)
        return now

    seconds = tf.py_function(read, [probe], tf.float64)
    seconds.set_shape(())
    return seconds


class StepClock:
    """This process's step readings and the current epoch's per-step durations."""

    def __init__(self):
        self._lock = threading.Lock()
        self.steps = 0  # steps completed since the fit started
        self.step = 0  # the step running now (or next)
        self.phase = "starting"  # what this worker is doing: see `where`
        self.since = time.monotonic()  # when `phase` began
        self.last_end = None  # time.monotonic() of the last completed step
        self._begun = None
        self._marks: dict = {}
        self._epoch: list[dict] = []
        self._durations: list[float] = []  # every completed step's seconds this fit

    def begin(self) -> None:
        with self._lock:
            self._begun, self._marks = time.perf_counter(), {}
            self.phase, self.since = "input", time.monotonic()

    def mark(self, name: str, at: float | None = None) -> None:
        """A reading from inside the step (one per replica: the last one counts)."""
        at = time.perf_counter() if at is None else at
        with self._lock:
            self._marks[name] = max(at, self._marks.get(name, at))
            self.phase = {"input": "compute", "gradients": "all-reduce",
                          "summed": "update"}.get(name, self.phase)
            self.since = time.monotonic()

    def end(self) -> None:
        now = time.perf_counter()
        with self._lock:
            begun = self._begun if self._begun is not None else now
            marks = self._marks
            split = {"step": now - begun}
            if all(m in marks for m in MARKS):
                split.update(input=marks["input"] - begun,
                             compute=marks["gradients"] - marks["input"],
                             comm=marks["summed"] - marks["gradients"])
            self._epoch.append(split)
            self._durations.append(split["step"])
            self.steps += 1
            self.step += 1
            self.last_end = time.monotonic()
            self.phase, self.since = "between steps", self.last_end
            self._begun = None

    def where(self) -> str:
        """What this worker is doing now, for a hang report."""
        with self._lock:
            phase = {"input": "waiting for its input (its pipeline, or the workers agreeing on "
                              "the next batch)", "compute": "computing",
                     "all-reduce": "in the gradient all-reduce", "update": "updating",
                     "between steps": "between steps (a callback, or Python)",
                     "starting": "starting (building or tracing the step)"}[self.phase]
            return f"step {self.step}: {phase} for {time.monotonic() - self.since:.0f} s"

    def median_step(self) -> float | None:
        with self._lock:
            return statistics.median(self._durations) if self._durations else None

    def epoch_medians(self, skip: int = 0) -> dict:
        """Median seconds of this epoch's steps (after the first `skip`): step, and input,
        compute and comm where the step was timed inside; then a new epoch starts."""
        with self._lock:
            steps, self._epoch = self._epoch[skip:] or self._epoch, []
        return {key: statistics.median(s[key] for s in steps if key in s)
                for key in ("step", "input", "compute", "comm")
                if any(key in s for s in steps)}



_current: StepClock | None = None  # the clock of the fit running in this process


def start() -> StepClock:
    """A fresh clock for the fit starting now, which the step's readings mark."""
    global _current
    _current = StepClock()
    return _current


def current() -> StepClock | None:
    return _current


def stop() -> None:
    """The fit has ended: readings of a traced step mark nothing until the next `start`."""
    global _current
    _current = None
