"""A user's own mistakes under MultiWorkerMirrored (kdist.wiring.agreement), with 2 real
workers: a model created outside kdist.scope() is refused where compiled inside it and said to
train alone where wholly local, and workers that would train different things are told which and where before any step
(instead of TensorFlow's mismatched collectives, or a wait until the timeout)."""

import sys

import portpicker
import pytest

from conftest import run_kdist
from kdist.wiring import agreement


def launch(mode, env=None):
    return run_kdist(["launch", "--workers", "2", "--timeout", "120", "--", sys.executable,
                      "tests/programs/mistakes_job.py", mode], timeout=150, env=env)


def headline(result) -> str:
    return next(line for line in result.stdout.splitlines() if "first failure:" in line)


def test_a_model_created_outside_and_compiled_inside_the_scope_is_refused_with_the_fix():
    result = launch("compiled_inside")
    assert result.returncode == 1, result.stdout[-3000:]
    line = headline(result)
    assert "this model was created outside kdist.scope() and compiled inside it" in line and \
        "inside `with kdist.scope():`" in line, line


def test_a_wholly_local_model_trains_alone_on_each_worker_and_says_so():
    """Built and compiled before kdist.scope(): a local model (a reference on the chief may be
    one), trained on each worker alone; every worker says so once, with the fix."""
    result = launch("outside")
    assert result.returncode == 0, result.stdout[-3000:]
    for task in ("worker-0", "worker-1"):
        said = [line for line in result.stdout.splitlines() if line.startswith(f"[{task}] kdist: "
                "this model was created outside kdist.scope(): fit trains it on this worker "
                "alone, not with the other 1 worker(s)")]
        assert len(said) == 1, result.stdout[-3000:]


@pytest.mark.parametrize("mode,words", [
    ("batch_size", "batch_size is 16 on worker:0 and 32 on worker:1"),
    ("width", "model layers[0].config.units is 8 on worker:0 and 16 on worker:1"),
])
def test_workers_that_differ_are_named_before_any_step(mode, words):
    result = launch(mode)
    assert result.returncode == 1, result.stdout[-3000:]
    line = headline(result)
    assert words in line, line
    assert "Fix: run the same program with the same arguments" in line


def test_agreeing_facts_show_no_difference():
    facts = {"variables": [["d/kernel", [4, 8], "float32"]], "batch_size": 16, "rows": 64}
    assert agreement.first_difference(facts, dict(facts)) is None
    assert agreement.first_difference(facts, {**facts, "variables": []}) == \
        ("variable d/kernel", "shape (4, 8) float32", "absent")


def test_one_ring_port_for_two_workers_on_a_host_is_the_headline():
    """The headline names the setting and the fix, not TensorFlow's "Graph execution error:"
    (the ring starts inside the first step's graph)."""
    result = launch("same", env={"KDIST_RING_PORT": str(portpicker.pick_unused_port())})
    assert result.returncode == 1, result.stdout[-3000:]
    line = headline(result)
    assert "raised UnknownError: RingError: the ring's port" in line and "is taken " \
        "(KDIST_RING_PORT)" in line and "give each worker on a host its own KDIST_RING_PORT" \
        in line, line
