"""SIGTERM to one worker -> every worker saves at the same step, without a collective per step.

The notice travels through the key-value store of TensorFlow's coordination service (the
mechanism of TF's own `PreemptionCheckpointHandler`, which serves custom loops only):

1. SIGTERM only sets a flag in the process that received it.
2. At its next step boundary that worker publishes the step to save at: its completed steps + 2.
   Synchronous workers are never a whole step apart (each step's all-reduce needs every worker),
   and none can finish the step after next before the publishing worker does, so every worker
   can still reach the agreed step.
3. Every worker runs a watcher thread blocked on that key; when it appears, the thread records
   the agreed step. Each step boundary costs one comparison of two integers.

In one process (Mirrored, the parameter-server chief, no strategy) the flag alone decides.

>>> from kdist.cluster.spec import ClusterSpec
>>> notice = PreemptionNotice(ClusterSpec({}))  # one process: no watcher
>>> notice.step_done(), notice.close()
(False, None)
"""

from __future__ import annotations

import signal
import threading
import time

from kdist import global_state
from kdist.keras_seam import tf_internals

MARGIN = 2  # steps between the notice and the agreed save
POLL_MS = 1000  # the watcher wakes this often to see whether its fit has ended


class PreemptionNotice:
    """Records SIGTERM; `step_done()` returns True at the step where every worker saves."""

    def __init__(self, spec):
        self.received = False  # this process got SIGTERM
        self.save_at = None  # the agreed step, once known
        self._steps = 0
        self._shared = spec.num_workers > 1 and not spec.has_ps  # else one process runs fit
        # A fresh key for every fit: every worker runs the same fits in the same order.
        fit = next(global_state.process().preemption_fits)
        self._key = f"kdist/preemption/fit-{fit}"
        self._closed = threading.Event()
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._watcher = None
        if self._shared:
            self._watcher = threading.Thread(target=self._watch, name="kdist-preemption",
                                             daemon=True)
            self._watcher.start()

    def _on_sigterm(self, signum, frame):
        self.received = True

    def step_done(self) -> bool:
        """Called after every training step; True when this step is the one to save at."""
        self._steps += 1
        if not self._shared:
            return self.received
        if self.received and self.save_at is None:
            self._publish(self._steps + MARGIN)
        return self.save_at is not None and self._steps >= self.save_at

    @property
    def pending(self) -> bool:
        """A notice that arrived too late to act on inside `fit`."""
        return self.received or self.save_at is not None

    def _publish(self, step: int) -> None:
        try:
            tf_internals.set_job_key(self._key, str(step))
        except Exception:  # noqa: BLE001 (another worker published first: its step holds)
            pass
        self.save_at = int(tf_internals.get_job_key(self._key))

    def _watch(self) -> None:
        while not self._closed.is_set():
            started = time.monotonic()
            try:
                value = tf_internals.get_job_key(self._key, POLL_MS)
            except Exception:  # noqa: BLE001 (deadline: not published yet; or the job is ending)
                if time.monotonic() - started < POLL_MS / 2000:  # failed at once: do not spin
                    self._closed.wait(POLL_MS / 1000)
                continue
            self.save_at = int(value)
            return

    def close(self) -> None:
        """Stops the watcher and restores the previous SIGTERM handler."""
        self._closed.set()
        signal.signal(signal.SIGTERM, self._previous)
