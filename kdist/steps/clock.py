"""Where a training step's time goes on this worker: waiting for input, computing, communicating.

Three clock readings inside the traced step, each TensorFlow's `tf.timestamp()` run once what it
times exists:

- ``input``: the batch has arrived (the start of `train_step`);
- ``gradients``: every gradient exists (where they are handed to the all-reduce);
- ``summed``: the all-reduce has returned.

A timestamp takes no input, and Grappler's dependency optimizer lets one under control
dependencies run early; so each reading runs inside a `tf.cond` whose predicate reads one value of
every tensor it times (a data dependency, which Grappler keeps), both branches the timestamp.
Each costs a few microseconds (a `tf.py_function` would cost about 100; benchmarks/
instrumentation.py measures them) and writes its time into one small variable of this process
(`stamps()`), which the step clock reads at the step's end, and the hang watchdog at any time.

With the readings at the step's start and end (`StepWatch`'s batch callbacks; the in-step readings
are read on the first 4 steps of each epoch and every 8th after), a step splits into
input (start -> input: launching the step, the input pipeline, and under MultiWorkerMirrored the
workers agreeing that each has a next batch, which waits for the slowest), compute (input ->
gradients: this worker's own work), communication (gradients -> summed, the waiting for slower
workers included) and the rest (the update, metrics, logs). With several replicas in a process,
each reading is the last replica's to write. `kdist.balance`'s measurement reads the same clock
(`reading`).

>>> clock = StepClock()
>>> clock.begin(); clock.end(); sorted(clock.epoch_medians())
['step']
"""

from __future__ import annotations

import collections
import statistics
import threading
import time

from kdist import global_state

MARKS = ("input", "gradients", "summed")
FIRST_SAMPLED, SAMPLE_EVERY = 4, 8  # steps whose split is read: see StepClock._sampled
WINDOW = 2048  # the last steps whose times are kept (medians; a long run stays flat in memory)


def stamps():
    """The variable the named readings write, created once per process (by `StepWatch`, at the
    same point of every worker's program: under MultiWorkerMirrored, creating a variable in the
    strategy's scope is a collective)."""
    def create():  # the last readings, in seconds since the epoch
        import tensorflow as tf

        with tf.init_scope():
            return tf.Variable(tf.fill([len(MARKS)], tf.constant(-1.0, tf.float64)),
                               trainable=False, name="kdist_step_clock")

    state = global_state.process()
    if state.step_stamps is None:
        state.step_stamps = create()
    return state.step_stamps


def watching(running: bool) -> None:
    """A watched fit starts (True) or ends (False): steps traced meanwhile get the readings."""
    global_state.process().steps_watched = running


def tracing_watched() -> bool:
    return global_state.process().steps_watched


def reading(after, name: str | None = None, whole: bool = False):
    """A tensor of the host's clock (`tf.timestamp()`, seconds), read once `after` (a tensor or a
    list of them) exists; with `name`, also written to this process's clock variable (read by
    the running fit's `StepClock`). The reading waits for one value of each tensor (cheap
    enough for every step, none for an empty tensor); `whole` waits for their sums instead, so every value is read once
    (what `kdist.balance`'s few timed passes use)."""
    import tensorflow as tf

    tensors = [t.values if isinstance(t, tf.IndexedSlices) else t
               for t in tf.nest.flatten(after) if t is not None]
    numeric = [t for t in tensors
               if (t.dtype.is_floating or t.dtype.is_integer) and t.shape.num_elements() != 0]
    # [:1], not [0]: a replica's share of a short last batch may be empty
    probe = tf.add_n([tf.reduce_sum(tf.cast(t if whole else tf.reshape(t, [-1])[:1], tf.float64))
                      for t in numeric]) \
        if numeric else tf.constant(0.0, tf.float64)
    seconds = tf.cond(tf.math.is_nan(probe), tf.timestamp, tf.timestamp)
    if name is not None:
        stamps()[MARKS.index(name)].assign(seconds)
    return seconds


class StepClock:
    """This process's step readings and the current epoch's per-step durations."""

    def __init__(self, variable=None):
        self._lock = threading.Lock()
        self._variable = variable  # the in-step readings (None: only the batch callbacks)
        self.steps = 0  # steps completed since the fit started
        self.step = 0  # the step running now (or next)
        self.begun = None  # time.time() when the running step began (None: between steps)
        self.last_end = None  # time.monotonic() of the last completed step
        self.since = time.monotonic()  # when the current state began
        self._epoch: collections.deque = collections.deque(maxlen=WINDOW)
        self._epoch_steps = 0  # the epoch's steps, also those no longer in the window
        self._durations: collections.deque = collections.deque(maxlen=WINDOW)  # steps' seconds

    def begin(self) -> None:
        with self._lock:
            self.begun, self.since = time.time(), time.monotonic()

    def end(self) -> None:
        now = time.time()
        marks = self._marks() if self._sampled() else {}
        with self._lock:
            begun = self.begun if self.begun is not None else now
            split = {"step": now - begun}
            if all(begun <= marks.get(m, -1) <= now for m in MARKS):
                split.update(input=marks["input"] - begun,
                             compute=marks["gradients"] - marks["input"],
                             comm=marks["summed"] - marks["gradients"])
            self._epoch.append(split)
            self._epoch_steps += 1
            self._durations.append(split["step"])
            self.steps += 1
            self.step += 1
            self.last_end = self.since = time.monotonic()
            self.begun = None

    def _sampled(self) -> bool:
        """Whether this step's in-step readings are read (a variable read costs about as much
        as the readings themselves): the first steps of each epoch, then every `SAMPLE_EVERY`."""
        return self._epoch_steps < FIRST_SAMPLED or self.step % SAMPLE_EVERY == 0

    def _marks(self) -> dict:
        if self._variable is None:
            return {}
        return dict(zip(MARKS, (float(v) for v in self._variable.numpy())))

    def where(self) -> str:
        """What this worker is doing now, for a hang report (the watchdog's thread reads the
        in-step readings while the step runs)."""
        marks = self._marks()
        with self._lock:
            begun = self.begun
            waited = time.monotonic() - self.since
            if self.steps == 0 and begun is None:
                phase = "starting (building or tracing the step)"
            elif begun is None:
                phase = "between steps (a callback, or Python)"
            else:
                done = [m for m in MARKS if marks.get(m, -1) >= begun]
                phase = {0: "waiting for its input (its pipeline, or the workers agreeing on the "
                            "next batch)",
                         1: "computing", 2: "in the gradient all-reduce", 3: "updating"}[len(done)]
                if done:
                    waited = time.time() - marks[done[-1]]
            return f"step {self.step}: {phase} for {waited:.0f} s"

    def median_step(self) -> float | None:
        with self._lock:
            return statistics.median(self._durations) if self._durations else None

    def epoch_medians(self, skip: int = 0) -> dict:
        """Median seconds of this epoch's last `WINDOW` steps (after the first `skip`, where
        they are among them): step, and input, compute and comm where the step was timed inside;
        then a new epoch starts."""
        with self._lock:
            steps = list(self._epoch)
            if self._epoch_steps == len(steps):
                steps = steps[skip:] or steps
            self._epoch.clear()
            self._epoch_steps = 0
        return {key: statistics.median(s[key] for s in steps if key in s)
                for key in ("step", "input", "compute", "comm")
                if any(key in s for s in steps)}
