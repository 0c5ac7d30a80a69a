"""Where the suite's time goes: with KDIST_SUITE_PROFILE=FILE set, one JSON line per test in FILE.

Each line has the test's wall seconds (setup, call and teardown), the CPU seconds the whole machine
spent meanwhile (every process: the test's children included) and the Python processes the test
started (pytest's descendants, seen by a look every 0.25 s: each pays TensorFlow's import of about
3 s, so none is missed). CPU seconds over wall seconds times the cores says whether the test kept
the machine busy or waited; `benchmarks/ci_profile.py` turns the lines into the saved CI profile. Unset, this
plugin does nothing.
"""

import json
import os
import threading
import time

import psutil
import pytest

_PATH = os.environ.get("KDIST_SUITE_PROFILE")


def _busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy since boot."""
    with open("/proc/stat") as stat:
        ticks = [int(f) for f in stat.readline().split()[1:]]  # cpu user nice system idle iowait..
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class _PythonChildren(threading.Thread):
    """Counts the Python processes below pytest while a test runs."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen, self.done = set(), threading.Event()
        self.start()

    def run(self):
        me = psutil.Process()
        while not self.done.wait(0.25):
            for child in me.children(recursive=True):
                try:
                    if child.name().startswith("python"):
                        self.seen.add((child.pid, child.create_time()))
                except psutil.Error:
                    pass

    def stop(self) -> int:
        self.done.set()
        self.join()
        return len(self.seen)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _PATH:
        yield
        return
    start, busy, children = time.monotonic(), _busy_seconds(), _PythonChildren()
    yield
    wall, busy = time.monotonic() - start, _busy_seconds() - busy
    with open(_PATH, "a") as out:
        out.write(json.dumps({"test": item.nodeid, "wall_s": round(wall, 3),
                              "cpu_s": round(busy, 2), "cores": os.cpu_count(),
                              "processes": children.stop()}) + "\n")
