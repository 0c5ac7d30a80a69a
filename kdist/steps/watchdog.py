"""Hangs, diagnosed: when no training step completes for too long, say where every worker is.

A thread per worker watches the step clock (`kdist.steps.clock`). Every few seconds it publishes
where this worker is (``step 57: in the gradient all-reduce for 12 s``) in the key-value store of
TensorFlow's coordination service, which every worker of a MultiWorkerMirrored job reaches
outside the collectives. When no step has completed for the hang timeout, every worker:

1. writes the Python stacks of all its threads to its log (`faulthandler`);
2. logs where each worker is, from the store, naming the ones behind (those that have not reached
   the all-reduce the others wait in, or have not been heard of for a while: stopped, or hung in
   native code);
3. with ``hang_action="exit"`` (or ``KDIST_HANG_ACTION=exit``), exits with code 76
   (`exit_codes.HUNG`), which `kdist launch --max-restarts` restarts from the backup.

The timeout: ``KDIST_HANG_TIMEOUT`` (or ``kdist.scope(hang_timeout=...)``) seconds; by default
20 times the median step so far, never under 60 s. Before the first step completes (building
and tracing), 10 times that.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time

from kdist import envvars, exit_codes, validators
from kdist.keras_seam import tf_internals

logger = logging.getLogger("kdist")

MINIMUM = 60.0
MEDIANS = 20  # the default timeout, in median steps
FIRST_STEP = 10  # the first step may take this many timeouts (building, tracing)
PUBLISH_EVERY = 2.0  # a background thread's key-value write: nothing on the step's path
SILENT = 10.0  # seconds without a report that make a worker silent
ACTIONS = ("report", "exit")
_KEY = "kdist/watch/{task}"
READ_MS = 1000  # a report's read waits this long for a slot (a busy service answers late)


def settings(timeout=None, action=None) -> tuple[float | None, str]:
    """(timeout in seconds or None for the default rule, action), from the arguments or the
    environment; a bad value raises `UsageError` naming it."""
    if timeout is None:
        timeout = validators.seconds_from_env(envvars.HANG_TIMEOUT)
    else:
        validators.positive_number(timeout, "hang_timeout")
    action = action or os.environ.get(envvars.HANG_ACTION, "").strip() or "report"
    if action not in ACTIONS:
        raise validators.UsageError("hang_action", f"{action!r} is not an action",
                                    "use 'report' (stacks and the report, then wait on) or "
                                    "'exit' (then exit with code 76)")
    return timeout, action


class Watchdog(threading.Thread):
    """Watches `clock` for this task of `tasks` ("type:index" of every worker)."""

    def __init__(self, clock, task: str, tasks: list[str], timeout: float | None, action: str,
                 store=None):
        super().__init__(name="kdist-watchdog", daemon=True)
        self.clock, self.task, self.tasks = clock, task, tasks
        self.timeout, self.action, self.store = timeout, action, store
        self.fired_at_step = None
        self._halt = threading.Event()
        self._begun = time.monotonic()

    def stop(self):
        self._halt.set()
        self.join(timeout=5)

    def limit(self) -> float:
        """Seconds without a completed step that count as a hang, now."""
        median = self.clock.median_step()
        limit = self.timeout if self.timeout is not None else \
            max(MINIMUM, MEDIANS * (median or 0.0))
        return limit if self.clock.steps else FIRST_STEP * limit

    def run(self):
        published = -PUBLISH_EVERY  # at once: a worker stopped early still said where it was
        while True:
            now = time.monotonic()
            if self.store is not None and now - published >= PUBLISH_EVERY:
                published = now
                self.store.publish(_KEY.format(task=self.task),
                                   f"{time.time():.1f} {self.clock.where()}")
            stalled = now - (self.clock.last_end or self._begun)
            if stalled >= self.limit() and self.fired_at_step != self.clock.step:
                self.fired_at_step = self.clock.step
                self.fire(stalled)
            if self._halt.wait(0.5):
                return

    def fire(self, stalled: float) -> None:
        lines = [f"kdist: no training step completed on {self.task} for {stalled:.0f} s "
                 f"(hang timeout {self.limit():.0f} s, {envvars.HANG_TIMEOUT}); every thread's "
                 "stack follows, then where each worker is"]
        logger.error("%s", lines[0])
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for line in self.where_everyone_is():
            logger.error("%s", line)
        if self.action == "exit":
            logger.error("kdist: %s exits with code %d (hang_action='exit'): restart the job "
                         "from its backup (kdist launch --max-restarts does)", self.task,
                         exit_codes.HUNG)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exit_codes.HUNG)  # the main thread waits inside TensorFlow

    def where_everyone_is(self) -> list[str]:
        """One line per worker, from the store, then who is behind."""
        now = time.time()
        seen = {}
        for task in self.tasks:
            text = self.clock.where() if task == self.task else \
                (self.store.read(_KEY.format(task=task)) if self.store is not None else None)
            if text is None:
                seen[task] = (None, "never heard of (no report in the store)")
                continue
            if task == self.task:
                seen[task] = (0.0, text)
            else:
                stamp, _, where = text.partition(" ")
                seen[task] = (now - float(stamp), where)
        lines = []
        for task, (age, where) in seen.items():
            heard = "" if age is None or age < 2 else f" (reported {age:.0f} s ago" + (
                ": it has stopped reporting: stopped, or hung inside native code)"
                if age >= SILENT else ")")
            lines.append(f"kdist:   {task}: {where}{heard}")
        behind = _behind(seen)
        if behind:
            lines.append(f"kdist: behind: {', '.join(behind)}; the others wait for "
                         f"{'it' if len(behind) == 1 else 'them'}")
        return lines


def _behind(seen: dict) -> list[str]:
    """Workers not heard of lately, or at an earlier step, or not yet in the all-reduce that
    others wait in."""
    silent = [t for t, (age, _) in seen.items() if age is None or age >= SILENT]
    steps = {}
    for task, (_, where) in seen.items():
        if where.startswith("step "):
            steps[task] = (int(where.split(":")[0].split()[1]), "all-reduce" in where)
    if not steps:
        return silent
    furthest = max(steps.values())
    late = [t for t, position in steps.items() if position < furthest]
    return sorted(set(silent) | set(late), key=list(seen).index)


class CoordinationStore:
    """The coordination service's key-value store (MultiWorkerMirrored), keeping each key's
    latest value.

    The service cannot overwrite a key: a new value is a delete, then an insert. A worker stopped
    between the two (SIGSTOP, a hung host) would leave its key empty just when the others look for
    it, so each key has two slots written in turn, each value numbered: a reader takes the highest
    number it finds, and a stop can empty only the slot being written."""

    SLOTS = 2

    def __init__(self, backend=tf_internals):
        self.backend = backend  # replace_job_key and get_job_key, as in tf_internals
        self.written = 0

    def publish(self, key: str, value: str) -> None:
        self.written += 1
        try:
            self.backend.replace_job_key(f"{key}/{self.written % self.SLOTS}",
                                         f"{self.written} {value}")
        except Exception:  # noqa: BLE001 (a job shutting down: nothing to report to)
            pass

    def read(self, key: str) -> str | None:
        found = [self._get(f"{key}/{slot}") for slot in range(self.SLOTS)]
        numbered = [value.partition(" ") for value in found if value is not None]
        if not numbered:
            return None  # not published: the worker never got that far
        return max(numbered, key=lambda parts: int(parts[0]))[2]

    def _get(self, key: str) -> str | None:
        try:
            return self.backend.get_job_key(key, timeout_ms=READ_MS)
        except Exception:  # noqa: BLE001 (not there: never written, or its writer stopped)
            return None
