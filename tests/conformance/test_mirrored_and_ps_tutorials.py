"""Conformance: a Keras user's MirroredStrategy script and parameter-server script, each following
its tutorial with the two kdist lines (programs/mirrored_tutorial.py, parameter_server_tutorial.py)."""

import json
import os
import sys

from conftest import ROOT, run_kdist, run_report

PROGRAMS = os.path.join(ROOT, "tests", "conformance", "programs")


def test_mirrored_tutorial_on_two_logical_devices(tmp_path):
    report = run_report([os.path.join(PROGRAMS, "mirrored_tutorial.py"), str(tmp_path)],
                        timeout=240)
    assert report["strategy"] == "MirroredStrategy" and report["replicas"] == 2
    assert report["loss"][-1] < report["loss"][0]
    assert [round(rate, 7) for rate in report["rates"]] == [1e-3, 1e-3, 1e-4]  # the schedule
    assert report["checkpoints"] == ["ckpt_1.weights.h5", "ckpt_2.weights.h5", "ckpt_3.weights.h5"]
    assert report["loaded_max_diff"] == 0.0  # loaded with and without a strategy: same model
    assert report["replicated_variable"] == "MirroredVariable"
    assert len(os.listdir(tmp_path / "logs" / "train")) == 1


def test_parameter_server_tutorial_chief_two_workers_two_ps(tmp_path):
    result = run_kdist(["launch", "--chief", "--workers", "2", "--ps", "2", "--timeout", "300",
                        "--", sys.executable, os.path.join(PROGRAMS, "parameter_server_tutorial.py"),
                        str(tmp_path)], timeout=350)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.load(open(tmp_path / "chief.json"))
    assert report["strategy"] == "ParameterServerStrategyV2"
    assert report["loss"][-1] < report["loss"][0] and report["accuracy"][-1] > 0.6
    assert report["iterations"] == 4 * 20  # every scheduled step applied once (10 per execution)
    assert report["evaluation"]["accuracy"] > 0.6
    assert report["files"] == ["ckpt.keras", "logs"]  # the backup is deleted when fit ends
    mixed = report["mixed_float16"]
    assert "error" not in mixed and mixed["loss"][-1] < mixed["loss"][0]
