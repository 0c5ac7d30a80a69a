"""What a launch does after an attempt ends: the restart policy, apart from the loop that starts
and watches tasks (as torchrun's elastic agent keeps `_restart_workers` apart from
`_monitor_workers`). A pure function of what happened, with no process, clock or output.

>>> from kdist.launch.config import LaunchConfig
>>> config = LaunchConfig(max_restarts=2, min_workers=1)
>>> after_failure(config, Attempt(restarts=0, workers=2, failed="worker-1"))
Decision(restart=True, without=None)
>>> after_failure(config, Attempt(restarts=1, workers=2, failed="worker-1",
...                               failed_before="worker-1"))
Decision(restart=True, without=('worker', 1))
>>> after_failure(config, Attempt(restarts=2, workers=1, failed="worker-0"))
Decision(restart=False, without=None)
"""

from __future__ import annotations

import dataclasses

from kdist.launch.config import LaunchConfig


@dataclasses.dataclass(frozen=True)
class Attempt:
    """A failed attempt, as the policy sees it.

    Attributes:
        restarts: the restarts made before this attempt.
        workers: the chief and workers this attempt ran.
        failed: the task that failed it (``worker-1``), None where none is known.
        failed_before: the task that failed the attempt before, where that one restarted the
            whole group (a smaller restart judges the next failure afresh).
    """

    restarts: int
    workers: int
    failed: str | None
    failed_before: str | None = None


@dataclasses.dataclass(frozen=True)
class Decision:
    """Restart or not, and the chief or worker (type, index) to leave out of the next attempt."""

    restart: bool
    without: tuple[str, int] | None = None


def after_failure(config: LaunchConfig, attempt: Attempt) -> Decision:
    """A failed attempt restarts while `max_restarts` allows; a chief or worker that fails two
    attempts in a row is taken for a lost host and left out, down to `min_workers`."""
    if attempt.restarts >= config.max_restarts:
        return Decision(restart=False)
    return Decision(restart=True, without=_lost(config, attempt))


def _lost(config: LaunchConfig, attempt: Attempt) -> tuple[str, int] | None:
    if (config.min_workers is None or attempt.failed is None
            or attempt.failed != attempt.failed_before):
        return None
    task_type, index = attempt.failed.rsplit("-", 1)
    if task_type not in ("chief", "worker") or attempt.workers <= config.min_workers:
        return None
    return task_type, int(index)
