"""Shared fixtures: run kdist's real programs in fresh processes, and leave nothing behind."""

import os
import subprocess
import sys

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "tests", "programs")
# suite_profile: KDIST_SUITE_PROFILE=FILE, where the time goes, per test; tier_marks: the
# `compat` and `quick` markers from tests/tiers/*.txt
pytest_plugins = ["suite_profile", "tier_marks"]
collect_ignore = ["programs", "conformance/programs"]  # scripts run in child processes, never imported by pytest
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
# Ray starts its workers at nice 15 unless told otherwise: beside a CPU hog (issue 35's loaded
# runs) the Ray snippets and jobs of the suite then crawl. Every child runs Ray's workers at its
# own priority, as Ray's job manager does for submitted jobs.
os.environ.setdefault("RAY_worker_niceness", "0")


# Every timeout of the suite, the child processes' `kdist launch --timeout` included, is sized for
# this project's 2-core CI machine when idle, and multiplied by how much slower the machine runs
# right now (`machine_slowdown`, measured before each use, at most every 20 s) and by
# KDIST_TEST_TIMEOUT_SCALE (default 1; a fixed extra margin). A busy machine gets longer timeouts;
# a hang still ends, with the timeout's error.
TIMEOUT_SCALE = float(os.environ.get("KDIST_TEST_TIMEOUT_SCALE", "1"))
# Seconds `_probe_seconds` takes on the idle 2-core CI machine (the median of 10 idle runs there, 2026-11-23).
REFERENCE_PROBE_SECONDS = 0.070
_slowdown = {"value": 1.0, "at": -1e9}
_PROBE = "import time\nt = time.perf_counter()\nsum(i * i for i in range(2_000_000))\n" \
         "print(time.perf_counter() - t)"


def _probe_seconds() -> float:
    """Wall seconds of a fixed CPU-bound loop run in as many processes as the machine has cores,
    side by side, as a training cluster of the suite runs: what another load steals shows."""
    processes = [subprocess.Popen([sys.executable, "-S", "-c", _PROBE], stdout=subprocess.PIPE,
                                  text=True) for _ in range(os.cpu_count() or 1)]
    try:
        return max(float(p.communicate(timeout=120)[0]) for p in processes)
    finally:
        for p in processes:
            p.kill()


def machine_slowdown() -> float:
    """How many times slower than the idle CI machine this one runs now (at least 1)."""
    import time

    if time.monotonic() - _slowdown["at"] > 20:
        _slowdown["value"] = max(1.0, _probe_seconds() / REFERENCE_PROBE_SECONDS)
        _slowdown["at"] = time.monotonic()
    return _slowdown["value"]


def scaled(seconds: float) -> float:
    """`seconds` times the machine's slowdown now, times KDIST_TEST_TIMEOUT_SCALE."""
    return seconds * machine_slowdown() * TIMEOUT_SCALE


def run_python(args, timeout, env=None, cwd=ROOT):
    """Runs `python ARGS` in a fresh process (fresh TF runtime); killed at `timeout` seconds
    (scaled). A `--timeout N` among ARGS (kdist launch's) is scaled the same way."""
    args = [str(round(scaled(float(a)))) if i and args[i - 1] == "--timeout" and a.isdigit() else a
            for i, a in enumerate(args)]
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=scaled(timeout), env={**os.environ, **QUIET_TF, **(env or {})})


def run_report(args, timeout):
    """Runs a tests/programs script in a fresh process; returns the JSON it printed last."""
    import json

    result = run_python(args, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_kdist(args, timeout, env=None):
    """Runs the `kdist` command line (`python -m kdist ARGS`)."""
    return run_python(["-m", "kdist", *args], timeout=timeout, env=env)


@pytest.fixture(autouse=True)
def no_orphans():
    """Fails a test that leaves a child process of pytest running (TF servers included)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for process in left:
        process.kill()
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"


@pytest.fixture
def netns():
    """Network namespaces (root, iproute2) for the multi-host tests: skipped where there are none,
    except in CI (.ci/run sets KDIST_REQUIRE_NETNS, so they always run there). Namespaces left by
    an earlier run that was killed are deleted first; afterwards the test may leave none."""
    from kdist.k8s import netlab

    reason = netlab.unavailable_reason()
    if reason and not os.environ.get("KDIST_REQUIRE_NETNS"):
        pytest.skip(reason)
    netlab.remove_stale()
    before = set(netlab.namespaces())
    yield
    # Another test running beside this one (pytest -n) may hold namespaces of its own: a
    # namespace is this test's when this process or one that has ended made it.
    ours = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
    made_by = {name: netlab.creator(name) for name in set(netlab.namespaces()) - before}
    left = sorted(name for name, pid in made_by.items() if pid in ours or not psutil.pid_exists(pid))
    assert not left, f"namespaces left behind: {left}"


CPU_CGROUPS = "/sys/fs/cgroup/cpu"  # cgroup v1's CPU controller


@pytest.fixture
def slow_cpu_cgroup():
    """A CPU cgroup capped at 20% of one core (2 ms in every 10 ms): a slow machine for the process
    that joins it (writes its pid to <path>/cgroup.procs). Skipped where none can be made, except
    in CI (.ci/run sets KDIST_REQUIRE_CGROUP). Removed afterwards."""
    path = os.path.join(CPU_CGROUPS, f"kdist-test-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        for name, value in (("cpu.cfs_period_us", 10000), ("cpu.cfs_quota_us", 2000)):
            with open(os.path.join(path, name), "w") as f:
                f.write(str(value))
    except OSError as error:
        if os.environ.get("KDIST_REQUIRE_CGROUP"):
            raise
        pytest.skip(f"no CPU cgroup here ({error}): needs root and cgroup v1's cpu controller")
    yield path
    os.rmdir(path)  # fails if a process of the test is still in it


def simulate_mnist_pods(*format_args):
    """`kdist k8s simulate` of cluster_specs/k8s-mwms.yaml training examples/mnist_multiworker.py
    for one epoch, every pod in its own network namespace: asserts it succeeds, returns stdout."""
    result = run_kdist(["k8s", "simulate", "--spec", "cluster_specs/k8s-mwms.yaml", *format_args,
                        "--timeout", "240", "--", sys.executable, "examples/mnist_multiworker.py",
                        "--data=digits", "--epochs=1"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[worker-1] kdist: strategy multi_worker" in result.stdout
    assert "[worker-0] uci_digits: test accuracy" in result.stdout
    return result.stdout
