"""What the launcher asks of the tasks of one attempt, wherever they run: `TaskBackend`.

The launcher (`kdist.launch.launcher`) decides when the job has succeeded or failed and what the
summary says; what to restart, and which task is lost, is `kdist.launch.policy`'s pure function.
A backend carries out one attempt:
it starts the tasks it is given, tells how each one is doing (`Task.poll`), and stops them.
`kdist.launch.group.TaskGroup` runs them as local processes, which is what `kdist launch` uses.
Another place to run tasks (a scheduler's API, a test's fake) is one class with these methods,
handed to `Launcher(backend=...)` as a factory the launcher calls once per attempt.

>>> import io, threading
>>> from kdist.launch.group import TaskGroup
>>> isinstance(TaskGroup(io.StringIO(), threading.Lock()), TaskBackend)
True
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

# One task to start: its type, index, command line and environment (TF_CONFIG included).
TaskStart = tuple[str, int, list[str], dict]


@runtime_checkable
class Task(Protocol):
    """One task of one attempt, as the launcher and its summary read it."""

    task_type: str
    index: int
    ended: float | None  # time.monotonic() when its end was first seen
    stopped_by: str | None  # why the launcher stopped it, if it did
    lines: object  # its last lines of output (a sequence of str)
    log_path: str | None  # where its whole output is kept, if anywhere

    @property
    def name(self) -> str:
        """``worker-1``."""

    def poll(self) -> int | None:
        """Its exit code once it has ended (`kdist.exit_codes` for a signal), else None."""

    def failure(self) -> dict | None:
        """The failure record it wrote as it failed (`kdist.failure`), if any."""


@runtime_checkable
class TaskBackend(Protocol):
    """Starts, watches and stops the tasks of one attempt."""

    tasks: list  # the `Task`s started, in the order given

    def start(self, tasks: list[TaskStart], on_error: Callable) -> None:
        """Starts every task; ``on_error(argv)`` turns a task that cannot start into the
        launcher's error."""

    def ask_for_stacks(self, tasks: list, because: str) -> None:
        """Asks each running task for its Python stacks (a timeout), recording `because`."""

    def stop(self, tasks: list, because: str) -> None:
        """Stops each running task, recording `because`, and returns once all have ended."""

    def notify(self, tasks: list, signum: int) -> None:
        """Sends `signum` to each running task that handles it (the others keep running)."""

    def close(self) -> None:
        """Stops what still runs and releases what the attempt held (output, files)."""
