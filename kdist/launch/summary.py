"""The end of `kdist launch`'s output: who failed first, how, when, its last lines, and what
happened to every other task; the same as JSON for schedulers and CI (``--summary FILE``).

>>> describe(137)
'killed by SIGKILL (signal 9): something outside the task killed it; the out-of-memory killer does this (see `dmesg`, or the container status OOMKilled)'
>>> describe(69)
'exit code 69: the other tasks did not start within the start-up deadline (KDIST_STARTUP_TIMEOUT)'
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import signal

from kdist import exit_codes, safe_files
from kdist.failure import headline

MEANINGS = {
    exit_codes.USAGE: "a usage error (a bad flag, spec or TF_CONFIG)",
    exit_codes.PEERS_MISSING: "the other tasks did not start within the start-up deadline "
                              "(KDIST_STARTUP_TIMEOUT)",
    exit_codes.PREEMPTED: "saved its backup on SIGTERM (restartable)",
    exit_codes.HUNG: "no step completed within the hang timeout (KDIST_HANG_TIMEOUT); it wrote "
                     "every thread's stack first",
    exit_codes.TIMED_OUT: "timed out",
    exit_codes.NOT_EXECUTABLE: "the program is not executable",
    exit_codes.NOT_FOUND: "the program was not found",
}


def describe(code: int, oom_kills: int = 0) -> str:
    """What an exit code (as a shell reports it) says about how a task ended."""
    if code > exit_codes.SIGNAL_BASE and code - exit_codes.SIGNAL_BASE < 65:
        number = code - exit_codes.SIGNAL_BASE
        name = _signal_name(number)
        if number == signal.SIGKILL:
            cause = ("the kernel's out-of-memory killer killed a process in this cgroup"
                     if oom_kills else "something outside the task killed it; the "
                     "out-of-memory killer does this (see `dmesg`, or the container status "
                     "OOMKilled)")
            return f"killed by {name} (signal {number}): {cause}"
        return f"killed by {name} (signal {number})"
    meaning = MEANINGS.get(code)
    return f"exit code {code}" + (f": {meaning}" if meaning else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclasses.dataclass
class TaskEnd:
    """How one task of the last attempt ended."""

    task: str
    exit_code: int | None  # None: still running when the launcher stopped (it then is killed)
    at: float | None  # seconds after the launch
    stopped_by: str | None  # why the launcher stopped it
    failure: dict | None  # the task's own record (kdist.failure), for an exception
    last_lines: list[str]
    log: str | None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.stopped_by is None

    def how(self, oom_kills: int = 0) -> str:
        if self.failure is not None:  # without "headline": another kdist version's record
            return "raised " + (self.failure.get("headline")
                                or headline(self.failure["type"], self.failure["message"]))
        if self.stopped_by is not None:
            return f"stopped by kdist because {self.stopped_by}"
        said = [line.strip() for line in self.last_lines if line.strip()]
        if self.exit_code == exit_codes.USAGE and said:  # Python's or the script's own words
            return f"exit code 2, a usage error: {said[-1]}"
        return "succeeded" if self.exit_code == 0 else describe(self.exit_code, oom_kills)


@dataclasses.dataclass
class Summary:
    """The job's end: its state and exit code, the first failure of its last attempt, every
    task, and the failures that made earlier attempts restart."""

    state: str
    exit_code: int
    started: float  # wall clock (time.time())
    duration: float
    restarts: int
    first_failure: TaskEnd | None
    tasks: list[TaskEnd]
    earlier: list[str]  # one line per restarted attempt
    oom_kills: int = 0
    hint: str | None = None  # what the first failure's text suggests (see Launcher._hint)

    def lines(self) -> list[str]:
        out = [f"summary: {self.state} with exit code {self.exit_code} after "
               f"{self.duration:.1f} s" + (f" and {self.restarts} restart(s)" if self.restarts
                                           else "")]
        out += [f"  earlier attempt: {line}" for line in self.earlier]
        first = self.first_failure
        if first is not None:
            out.append(f"  first failure: {first.task} at {first.at:.1f} s: "
                       f"{first.how(self.oom_kills)}")
            if first.last_lines:
                out.append(f"  its last lines{f' (all in {first.log})' if first.log else ''}:")
                out += [f"    | {line}" for line in first.last_lines[-10:]]
        if self.hint:
            out.append(f"  hint: {self.hint}")
        for task in self.tasks:
            if task is first:
                continue
            when = f" at {task.at:.1f} s" if task.at is not None else ""
            out.append(f"  {task.task}: {task.how(self.oom_kills)}{when}")
        return out

    def as_json(self) -> dict:
        def task(end: TaskEnd) -> dict:
            return {"task": end.task, "exit_code": end.exit_code, "at_s": end.at,
                    "how": end.how(self.oom_kills), "stopped_by": end.stopped_by,
                    "exception": None if end.failure is None else {
                        k: end.failure[k] for k in ("type", "message", "traceback")},
                    "last_lines": end.last_lines, "log": end.log}

        return {"state": self.state, "exit_code": self.exit_code,
                "started_at": datetime.datetime.fromtimestamp(
                    self.started, datetime.timezone.utc).isoformat(timespec="seconds"),
                "duration_s": round(self.duration, 3), "restarts": self.restarts,
                "earlier_attempts": self.earlier,
                "first_failure": None if self.first_failure is None else task(self.first_failure),
                "hint": self.hint, "tasks": [task(t) for t in self.tasks]}

    def save(self, path: str) -> None:
        safe_files.write_text(path, json.dumps(self.as_json(), indent=1) + "\n")


def oom_kills() -> int:
    """The out-of-memory kills in this process's memory cgroup so far (0 where unknown)."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"),
                      ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0
