"""Step timing, stragglers and hangs under MultiWorkerMirrored (kdist.steps), with 2 real workers:
a worker that stops (SIGSTOP) is reported by the other's watchdog with every thread's stack and
where each worker is, and with hang_action='exit' the job ends with code 76; a worker on a slow
machine (a 20% CPU cgroup) is named the slowest at each epoch's end, on lines of their own, and
nothing enters the user's History."""

import json
import re
import sys

import pytest

from conftest import run_kdist
from kdist.steps import watchdog

PROGRAM = "tests/programs/steps_job.py"


def test_a_stopped_worker_is_reported_with_stacks_and_positions_then_exit_76(tmp_path):
    result = run_kdist(["launch", "--workers", "2", "--timeout", "240", "--", sys.executable,
                        PROGRAM, "hang", str(tmp_path)], timeout=270,
                       env={"KDIST_HANG_TIMEOUT": "5", "KDIST_HANG_ACTION": "exit"})
    out = result.stdout
    assert result.returncode == 76, out[-4000:]
    assert re.search(r"\[worker-0\] kdist: no training step completed on worker:0 for \d+ s "
                     r"\(hang timeout 5 s, KDIST_HANG_TIMEOUT\)", out), out[-4000:]
    where = "\n".join(line for line in out.splitlines() if "kdist" in line)[-4000:]
    assert "[worker-0] Thread 0x" in out and "(most recent call first):" in out  # the stacks
    # 32 + 20; worker 0's next batch is already there (in-memory arrays: kdist's shares need
    # no agreement on a next batch), so it waits for worker 1 in the gradients' sum
    assert "[worker-0] kdist:   worker:0: step 52: in the gradient all-reduce" in out, where
    # worker 1 stopped: its last report (from a background thread, every 2 s) is older
    assert re.search(r"\[worker-0\] kdist:   worker:1: step \d+: .* \(reported \d+ s ago", out), \
        where
    assert "[worker-0] kdist: behind: worker:1; the others wait for it" in out, where
    assert "first failure: worker-0 at" in out and "exit code 76: no step completed within the " \
        "hang timeout" in out


def test_the_slow_worker_is_named_at_each_epochs_end(tmp_path, slow_cpu_cgroup):
    result = run_kdist(["launch", "--workers", "2", "--timeout", "300", "--", sys.executable,
                        PROGRAM, "straggle", str(tmp_path)], timeout=330,
                       env={"STEPS_JOB_CGROUP": slow_cpu_cgroup})
    assert result.returncode == 0, result.stdout[-4000:]
    lines = result.stdout.splitlines()
    heads = [k for k, line in enumerate(lines) if ": slowest worker:" in line]
    assert [lines[k].split(":")[0:2] for k in heads] == [["[worker-0] kdist", " epoch 1"],
                                                         ["[worker-0] kdist", " epoch 2"]]
    for k in heads:
        ratio = float(re.search(r"slowest worker:1, its compute ([\d.]+)x the fastest's "
                                r"\(worker:0\)$", lines[k])[1])
        assert ratio > 1.5, lines[k]
        for offset, task in ((1, "worker:1"), (2, "worker:0")):  # on lines of their own
            assert re.fullmatch(rf"\[worker-0\] kdist:   {task} input [\d.]+ ms, compute [\d.]+ "
                                r"ms, all-reduce [\d.]+ ms, step [\d.]+ ms", lines[k + offset])
    for task in ("worker:0", "worker:1"):  # the user's History holds the user's metrics only
        history = json.loads((tmp_path / f"{task}.json").read_text())
        assert sorted(history) == ["loss"], history


@pytest.mark.parametrize("env,given,expected", [
    ({}, {}, (None, "report")),
    ({"KDIST_HANG_TIMEOUT": "90"}, {}, (90.0, "report")),
    ({"KDIST_HANG_ACTION": "exit"}, {"timeout": 30}, (30, "exit")),
])
def test_hang_settings_come_from_the_scope_or_the_environment(monkeypatch, env, given, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert watchdog.settings(**given) == expected


@pytest.mark.parametrize("env,given,words", [
    ({"KDIST_HANG_TIMEOUT": "soon"}, {}, "KDIST_HANG_TIMEOUT='soon': is not a duration"),
    ({}, {"timeout": -1}, "hang_timeout: -1 is out of range"),
    ({}, {"action": "kill"}, "hang_action: 'kill' is not an action. Fix: use 'report'"),
])
def test_bad_hang_settings_are_refused_naming_them(monkeypatch, env, given, words):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(words)):
        watchdog.settings(**given)


def test_a_silent_or_earlier_worker_is_behind():
    seen = {"worker:0": (0.0, "step 20: in the gradient all-reduce for 9 s"),
            "worker:1": (1.0, "step 20: computing for 9 s"),
            "worker:2": (30.0, "step 20: in the gradient all-reduce for 30 s")}
    assert watchdog._behind(seen) == ["worker:1", "worker:2"]


def test_the_step_clock_stays_flat_over_a_long_run():
    """A long run (here 20,000 steps after a window's worth) keeps only the last steps' times:
    the clock's memory does not grow with the steps, and its medians still come."""
    import tracemalloc

    from kdist.steps.clock import WINDOW, StepClock

    clock = StepClock()
    for _ in range(WINDOW + 10):
        clock.begin()
        clock.end()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(20_000):
        clock.begin()
        clock.end()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 64 << 10, grown  # 20,000 kept steps would take over 1 MB
    assert clock.median_step() is not None and clock.steps == WINDOW + 20_010
    assert set(clock.epoch_medians(skip=1)) == {"step"}


class _Service:
    """The coordination service's store as the watchdog meets it: no overwrite (a new value is a
    delete, then an insert), and a writer that can stop between the two."""

    def __init__(self):
        self.keys, self.stop_after_delete = {}, False

    def replace_job_key(self, key, value):
        self.keys.pop(key, None)
        if self.stop_after_delete:
            raise SystemExit("stopped")  # the writer stops here: its key stays empty
        self.keys[key] = value

    def get_job_key(self, key, timeout_ms):
        if key not in self.keys:
            raise TimeoutError(f"{key} not found in {timeout_ms} ms")
        return self.keys[key]


def test_a_worker_stopped_inside_its_report_write_still_has_its_last_report_read():
    """The CI failure of 21fabaf: worker 1 stopped between the delete and the insert of its
    report, and worker 0's hang report said it was never heard of."""
    service = _Service()
    writer, reader = watchdog.CoordinationStore(service), watchdog.CoordinationStore(service)
    assert reader.read("kdist/watch/worker:1") is None
    for step in (50, 51):
        writer.publish("kdist/watch/worker:1", f"17.0 step {step}: computing for 0 s")
    service.stop_after_delete = True
    with pytest.raises(SystemExit):
        writer.publish("kdist/watch/worker:1", "19.0 step 52: waiting for its input for 0 s")
    assert reader.read("kdist/watch/worker:1") == "17.0 step 51: computing for 0 s"
