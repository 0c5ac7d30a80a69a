"""`LaunchConfig`: how a launch runs and supervises its tasks, with no command-line names.

The launcher (`kdist.launch.launcher.Launcher`) takes one; its errors name the config's fields
(``max_restarts: -1 is out of range...``). `kdist launch` builds one from its flags and says the
same errors in its flags' names (`in_flags`), as torchrun's ``run.py`` hands a ``LaunchConfig`` to
its agent.

>>> LaunchConfig(max_restarts=2, min_workers=1).max_restarts
2
>>> LaunchConfig(max_restarts=-1)
Traceback (most recent call last):
...
kdist.validators.UsageError: max_restarts: -1 is out of range. Fix: use a non-negative integer
"""

from __future__ import annotations

import dataclasses
import os
import re

from kdist import validators
from kdist.validators import UsageError

NETWORKS = ("private", "host")
# The command line's name of each field (`kdist launch --max-restarts`).
FLAGS = {"timeout": "--timeout", "grace": "--grace", "max_restarts": "--max-restarts",
         "min_workers": "--min-workers", "network": "--network", "log_dir": "--log-dir",
         "summary": "--summary", "tf_logs": "--tf-logs", "host": "--host"}


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """How a launch runs its tasks.

    Args:
        timeout: seconds before the whole job is stopped with exit code 124 (None: no limit).
        grace: seconds the other workers get to finish after the leader succeeded.
        stop_timeout: seconds between SIGTERM and SIGKILL when stopping a task.
        max_restarts: how many times a failed group is restarted before the job fails.
        min_workers: restart without a chief/worker that failed twice in a row, down to this many
            workers (None: always restart the whole group). Needs `max_restarts`.
        network: "private" (a network namespace, or an error), "host", or None (private where
            one can be made, else a warning).
        host: this machine's host in a multi-host spec (default: found from its addresses).
        log_dir: a folder for each task's whole output (`LOG_DIR/<task>.log`, appended across
            restarts) and the summary (`LOG_DIR/summary.json`).
        summary: a file for the summary as JSON (default: `LOG_DIR/summary.json` with `log_dir`).
        tf_logs: keep TensorFlow's C++ start-up logging in the output (always in the log files).
    """

    timeout: float | None = None
    grace: float = 30.0
    stop_timeout: float = 5.0
    max_restarts: int = 0
    min_workers: int | None = None
    network: str | None = None
    host: str | None = None
    log_dir: str | None = None
    summary: str | None = None
    tf_logs: bool = False

    def __post_init__(self):
        validators.non_negative_int(self.max_restarts, "max_restarts")
        if self.timeout is not None:
            validators.positive_number(self.timeout, "timeout")
        validators.non_negative_number(self.grace, "grace")
        validators.positive_number(self.stop_timeout, "stop_timeout")
        if self.network is not None and self.network not in NETWORKS:
            raise UsageError("network", f"{self.network!r} is not a network mode",
                             "use 'private' (the default: nothing outside reaches the tasks) or "
                             "'host' (the tasks share this machine's network)")
        if self.min_workers is not None:
            validators.positive_int(self.min_workers, "min_workers")
            if self.max_restarts == 0:
                raise UsageError("min_workers", "a smaller restart is a restart, and max_restarts "
                                 "is 0", "add max_restarts N (each smaller restart counts as one)")

    @property
    def summary_path(self) -> str | None:
        """Where the summary is saved: `summary`, else `LOG_DIR/summary.json`, else nowhere."""
        if self.summary:
            return self.summary
        return os.path.join(self.log_dir, "summary.json") if self.log_dir else None


def in_flags(error: UsageError) -> UsageError:
    """`error` (about a `LaunchConfig` field) in the command line's names: its field, and each
    two-word field its problem and fix name (``max_restarts``), become their flags (`FLAGS`).
    A field that is also a word (host, network) is left alone in the text."""
    named = [name for name in FLAGS if "_" in name]

    def flags(text: str) -> str:
        return re.sub(r"(?<![-\w])(" + "|".join(named) + r")\b", lambda m: FLAGS[m.group(1)],
                      text)

    return UsageError(FLAGS.get(error.field, error.field), flags(error.problem), flags(error.fix))
