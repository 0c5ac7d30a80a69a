"""The processes of one attempt of a local job: start them, relay their output, stop them.

`TaskGroup` is the launcher's backend for local processes (`kdist.launch.backend.TaskBackend`):
it knows nothing of flags or of the restart policy (`kdist.launch.launcher` decides
those). For each task it keeps what a summary needs: when it started and ended, who stopped it
and why, its last lines, and the failure record the task wrote itself (`kdist.failure`).

Output, line by line, prefixed ``[worker-1]``:

- a progress bar (Keras redraws it with carriage returns, backspaces and terminal colours) is
  written as its final state once its line ends, and at most every 10 s while it runs; colours
  are kept only when the launcher writes to a terminal;
- TensorFlow's C++ start-up logging (``I0000 ...``, ``W0000 ...``, absl's "All log messages
  before absl::InitializeLog()", the cuInit error of a machine without a GPU) is left out unless
  ``tf_logs`` (each task's log file keeps it);
- with ``log_dir``, every task's output goes, as it came, to ``LOG_DIR/<task>.log``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import threading
import time
from typing import IO, Callable

from kdist import envvars, exit_codes, safe_files

LAST_LINES = 20
PROGRESS_EVERY = 10.0  # seconds between two intermediate states of a progress bar
STACKS_SIGNAL = signal.SIGUSR1  # kdist.failure.STACKS_SIGNAL: a task that imported kdist dumps
STACKS_SECONDS = 2.0  # what the tasks get to write their stacks
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TF_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] "
    r"|E\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ cuda_\w+\.cc:\d+\] failed call to cuInit"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] tensorflow/"
    r"|To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler)")


def is_tf_noise(line: str) -> bool:
    """True for a line of TensorFlow's C++ start-up logging (oneDNN, CUDA stubs, CPU features)."""
    return bool(_TF_NOISE.match(_ANSI.sub("", line)))


class TaskRun:
    """One task's process in one attempt."""

    def __init__(self, task_type: str, index: int, process: subprocess.Popen, started: float,
                 failure_file: str | None, log_path: str | None):
        self.task_type, self.index, self.process = task_type, index, process
        self.started, self.ended = started, None  # time.monotonic()
        self.stopped_by: str | None = None  # why the launcher stopped it, if it did
        self.lines: collections.deque = collections.deque(maxlen=LAST_LINES)
        self.failure_file, self.log_path = failure_file, log_path
        self._failure = None  # the record, once read

    @property
    def name(self) -> str:
        return f"{self.task_type}-{self.index}"

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is None:
            return None
        if self.ended is None:
            self.ended = time.monotonic()
        return exit_codes.of_returncode(code)

    def failure(self) -> dict | None:
        """The record the task wrote as it failed (an uncaught exception), if any."""
        import json

        if self._failure is None and self.failure_file and os.path.isfile(self.failure_file):
            try:
                with open(self.failure_file, encoding="utf-8") as f:
                    self._failure = json.load(f)
            except (OSError, ValueError):
                pass
        return self._failure


class TaskGroup:
    """Starts, relays and stops the processes of one attempt."""

    def __init__(self, output: IO[str], lock: threading.Lock, log_dir: str | None = None,
                 tf_logs: bool = False, stop_timeout: float = 5.0):
        self.output, self._lock, self.log_dir = output, lock, log_dir
        self.tf_logs, self.stop_timeout = tf_logs, stop_timeout
        self.terminal = hasattr(output, "isatty") and output.isatty()
        self.tasks: list[TaskRun] = []
        self._readers: list[threading.Thread] = []
        self._records = None  # a private folder for the tasks' failure records

    def start(self, tasks: list[tuple[str, int, list[str], dict]], on_error: Callable) -> None:
        """Starts every (task_type, index, argv, env); `on_error(argv)` turns a failed exec
        into the launcher's error (a program gone since it was checked)."""
        import tempfile

        self._records = tempfile.mkdtemp(prefix="kdist-launch-")
        for task_type, index, argv, env in tasks:
            record = os.path.join(self._records, f"{task_type}-{index}.json")
            env = dict(env, **{envvars.FAILURE_FILE: record})
            if not self.tf_logs:
                env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            try:
                process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True, preexec_fn=_die_with_parent)
            except OSError:
                on_error(argv)
                raise
            log = os.path.join(self.log_dir, f"{task_type}-{index}.log") if self.log_dir else None
            self.tasks.append(TaskRun(task_type, index, process, time.monotonic(), record, log))
        for task in self.tasks:  # after every fork: no thread exists while preexec_fn runs
            reader = threading.Thread(target=self._relay, args=(task,), daemon=True)
            reader.start()
            self._readers.append(reader)

    def ask_for_stacks(self, tasks: list[TaskRun], because: str) -> None:
        """Asks each running task for the Python stacks of its threads (`STACKS_SIGNAL`, which
        a task that imported kdist answers on stderr) and gives them `STACKS_SECONDS`; a program
        without kdist ends on the signal, recorded as stopped `because`."""
        alive = [t for t in tasks if t.poll() is None]
        for task in alive:
            task.stopped_by = because
        ask_for_stacks([t.process for t in alive])

    def stop(self, tasks: list[TaskRun], because: str) -> None:
        """SIGTERM each task's process group, then SIGKILL what is left after `stop_timeout`;
        a task still running is recorded as stopped `because`."""
        alive = [t for t in tasks if t.poll() is None]
        for task in alive:
            task.stopped_by = because
            _signal_group(task.process, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for task in alive:
            try:
                task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for task in tasks:
            _signal_group(task.process, signal.SIGKILL)  # also reaps grandchildren left behind
            task.process.wait()
            task.poll()

    def notify(self, tasks: list[TaskRun], signum: int) -> None:
        """Sends `signum` to each running task whose process handles it."""
        for task in tasks:
            if task.poll() is None and _catches(task.process.pid, signum):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(task.process.pid, signum)

    def close(self) -> None:
        """Stops every task, waits for their output, removes the records' folder."""
        import shutil

        self.stop(self.tasks, because="the launcher ended")
        for reader in self._readers:
            reader.join(timeout=5)
        for task in self.tasks:
            task.failure()  # read before the folder goes
        if self._records:
            shutil.rmtree(self._records, ignore_errors=True)

    def write(self, text: str) -> None:
        with self._lock:
            self.output.write(text)
            self.output.flush()

    # ------------------------------------------------------------------ output
    def _relay(self, task: TaskRun) -> None:
        import codecs

        log = safe_files.open_for_append(task.log_path) if task.log_path else None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending, shown = "", time.monotonic()  # the unfinished line; its last state written at
        try:
            while chunk := os.read(task.process.stdout.fileno(), 1 << 16):
                text = decoder.decode(chunk)
                if log is not None:
                    log.write(text)
                    log.flush()
                *complete, pending = (pending + text).split("\n")
                for line in complete:
                    self._show(task, line)
                if "\r" in pending:  # a progress bar redrawing itself
                    pending = pending[pending.rfind("\r"):]
                    if time.monotonic() - shown >= PROGRESS_EVERY:
                        shown = time.monotonic()
                        self._show(task, pending)
            if pending:
                self._show(task, pending)
        finally:
            if log is not None:
                log.close()

    def _show(self, task: TaskRun, text: str) -> None:
        line = self.render(text)
        plain = _ANSI.sub("", line)
        if not plain.strip() or (not self.tf_logs and _TF_NOISE.match(plain)):
            return
        task.lines.append(plain)
        self.write(f"[{task.name}] {line}\n")

    def render(self, text: str) -> str:
        """A line as a terminal would show it at its end. To a terminal: its last redraw, as it
        came (the terminal applies it); elsewhere: replayed on a line without colours
        (a carriage return goes back to the start, a backspace back one place, characters
        overwrite)."""
        if self.terminal:
            return text.rstrip("\r").split("\r")[-1]
        shown: list[str] = []
        position = 0
        for char in _ANSI.sub("", text):
            if char == "\r":
                position = 0
            elif char == "\b":
                position = max(0, position - 1)
            elif position < len(shown):
                shown[position] = char
                position += 1
            else:
                shown.append(char)
                position += 1
        return "".join(shown).rstrip()


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGKILL us when the launcher dies."""
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the signal handlers still clean up
        pass


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (Linux: its SigCgt mask)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(caught, 16) >> (signum - 1) & 1)


def ask_for_stacks(processes: list) -> None:
    """Sends each process `STACKS_SIGNAL` (a program that imported kdist prints the Python
    stacks of its threads on stderr) and gives them `STACKS_SECONDS` to answer."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(STACKS_SIGNAL)
    if processes:
        time.sleep(STACKS_SECONDS)
