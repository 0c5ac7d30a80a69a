"""docs/migration.md, followed: a Horovod user's program and a tf.keras 2 + tf.distribute program,
each ported by the page (tests/programs/horovod_port.py, tf_keras2_port.py), trained on 2 real
workers (every worker's History the same, as Horovod's MetricAverageCallback made it; the files
written once) and checked against one device with `kdist verify`."""

import json
import sys

import pytest

from conftest import run_kdist

PORTS = ("tests/programs/horovod_port.py", "tests/programs/tf_keras2_port.py")


@pytest.mark.parametrize("program", PORTS)
def test_a_ported_program_trains_alike_on_every_worker(tmp_path, program):
    result = run_kdist(["launch", "--workers", "2", "--timeout", "240", "--", sys.executable,
                        program, str(tmp_path)], timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"worker{i}.json").read_text()) for i in (0, 1))
    assert first == second  # the metrics are the global batch's on every worker
    assert len(first["loss"]) == 2 and first["loss"][1] < first["loss"][0]
    assert first["accuracy"][1] > 0.7, first
    written = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".keras")
    assert written == (["checkpoint-1.keras", "checkpoint-2.keras"] if "horovod" in program
                       else ["model.keras"])


@pytest.mark.parametrize("program", PORTS)
def test_a_ported_program_trains_as_one_device(tmp_path, program):
    """The learning rate scaled for the 2 replicas (`kdist.scale_learning_rate`, in a warm-up for
    the Horovod port) is the one-device run's too: its one device stands for them."""
    result = run_kdist(["verify", "--workers", "2", "--steps", "4", "--timeout", "240", "--",
                        sys.executable, program, str(tmp_path)], timeout=540)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert "kdist verify: the same training as one device" in result.stdout
