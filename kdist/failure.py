"""A task's own record of why it failed, where its platform shows it.

`import kdist` chains `sys.excepthook`: when the program ends on an uncaught exception, the task
writes a record (task, exception type and message, the end of the traceback, time) and one line
``kdist: task worker:1 failed: ValueError: ...`` on stderr (Slurm's output file, Ray's and
`kubectl logs`), then Python prints the traceback as usual. The record goes

- to ``KDIST_FAILURE_FILE`` (JSON), which `kdist launch` sets for each task and reads into its
  summary (`kdist.launch.summary`);
- to ``/dev/termination-log`` when the process can write it: Kubernetes shows it as the pod's
  termination message (``kubectl describe pod``, the Job's status), which kdist's rendered pods
  also fall back to the log's end for (``terminationMessagePolicy: FallbackToLogsOnError``).

A task killed by a signal (SIGKILL, the out-of-memory killer) writes nothing: the launcher and the
platform report the signal. A task that `kdist launch` started (``KDIST_FAILURE_FILE`` set) also
writes the Python stacks of all its threads to stderr on ``SIGUSR1`` (`faulthandler`, which works
while the program is blocked in TensorFlow's native code): the launcher asks for them before it
stops a job that ran past ``--timeout``, so a hang says where each task was. Files are created
without following a symlink and without widening the process's umask (`kdist.safe_files`).

>>> record = record_of(ValueError("bad shape"), task="worker:1")
>>> record["task"], record["type"], record["message"], record["headline"]
('worker:1', 'ValueError', 'bad shape', 'ValueError: bad shape')
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback

from kdist import envvars, lost_peers, safe_files
from kdist.cluster import cluster

STACKS_SIGNAL = signal.SIGUSR1  # kdist.launch.group asks a launched task for its stacks with it
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096  # bytes Kubernetes keeps of a termination message
_installed = False


def record_of(error: BaseException, task: str | None = None) -> dict:
    """What a task says about the exception it is ending on."""
    trace = traceback.format_exception(type(error), error, error.__traceback__)
    message = str(error)
    return {"task": task or _task(), "pid": os.getpid(), "time": time.time(),
            "type": type(error).__name__, "message": message[:2000],
            "headline": _headline(type(error).__name__, message)[:1000],
            "traceback": "".join(trace).splitlines()[-40:]}


def headline(kind: str, message: str) -> str:
    """`kind: first line of message`, where the first line says what happened: under TensorFlow's
    "Graph execution error:" and the stack of the node it ran, the error itself.

    >>> headline("UnknownError", "Graph execution error:\\n\\nDetected at node F defined at "
    ...          "(most recent call last):\\n  File \\"t.py\\", line 9\\n\\nRingError: peer died\\n")
    'UnknownError: RingError: peer died'
    """
    lines = message.splitlines()
    if lines and lines[0].strip() == "Graph execution error:":
        lines = [line for line in lines[1:] if line.strip() and not line[0].isspace()
                 and not line.startswith("Detected at node")] or lines
    return f"{kind}: {lines[0]}" if lines else kind


def _headline(kind: str, message: str) -> str:
    """The headline, naming the peer where TensorFlow reports one lost (`kdist.lost_peers`)."""
    try:
        lost = lost_peers.explain(message, cluster())
    except Exception:  # noqa: BLE001 (a bad TF_CONFIG is the error being reported, maybe)
        lost = None
    return f"{kind}: {lost}" if lost else headline(kind, message)


_ending = {"on_exception": False}


def ending_on_exception() -> bool:
    """Whether the program is ending on an uncaught exception (seen by `install`'s hook; atexit
    handlers run after it)."""
    return _ending["on_exception"]


def install() -> None:
    """Chains `sys.excepthook` with the record, and under `kdist launch` dumps the stacks on
    `STACKS_SIGNAL` (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    if os.environ.get(envvars.FAILURE_FILE):
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
    previous = sys.excepthook

    def hook(kind, error, trace):
        if not _an_extensions_aside(trace):
            _ending["on_exception"] = True
            if not issubclass(kind, KeyboardInterrupt):
                try:
                    write(record_of(error))
                except Exception:  # noqa: BLE001 (never hide the program's own exception)
                    pass
        previous(kind, error, trace)

    sys.excepthook = hook


def _an_extensions_aside(trace) -> bool:
    """Cython prints an error it cannot raise (h5py's `__dealloc__` after a failed write) through
    `sys.excepthook` while the program goes on: not what the task ends on."""
    frames = traceback.extract_tb(trace) if trace is not None else []
    return bool(frames) and all(frame.filename.endswith(".pyx") for frame in frames)


def write(record: dict) -> None:
    """The record's line on stderr, its JSON to KDIST_FAILURE_FILE, its text to the termination
    log where there is one."""
    line = f"kdist: task {record['task']} failed: {record['headline']}"
    print(line, file=sys.stderr, flush=True)
    path = os.environ.get(envvars.FAILURE_FILE)
    if path:
        safe_files.write_text(path, json.dumps(record))
    if os.access(TERMINATION_LOG, os.W_OK):
        text = "\n".join([line, *record["traceback"][-15:]])
        with open(TERMINATION_LOG, "w", encoding="utf-8") as f:
            f.write(text.encode()[-TERMINATION_LIMIT:].decode(errors="ignore"))


def _task() -> str:
    try:
        return cluster().task or "local"
    except Exception:  # noqa: BLE001 (a bad TF_CONFIG is the error being reported, maybe)
        return "local"
