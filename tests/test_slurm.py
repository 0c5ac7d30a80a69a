"""Slurm: kdist.cluster() from a job step's environment, and a real 2-task step trained through it."""

import os
import socket
import subprocess
import sys

import portpicker
import pytest

from conftest import QUIET_TF, ROOT, scaled
from kdist import ClusterSpecError, cluster
from kdist.cluster.slurm import in_slurm_step

STEP = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "node[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}


@pytest.fixture
def slurm_step(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: a CPU-only node
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_every_task_of_a_step_is_a_worker_by_default(slurm_step):
    spec = cluster()
    assert spec.source == "Slurm" and spec.task == "worker:1"
    assert spec.jobs == {"worker": ["node07:8888", "node07:8889", "node08:8888", "node08:8889"]}


def test_roles_and_port_come_from_kdist_variables(slurm_step):
    slurm_step.setenv("KDIST_SLURM_ROLES", "chief=1,worker=2,ps=1")
    slurm_step.setenv("KDIST_SLURM_PORT", "7000")
    spec = cluster()
    # TF assigns ranks in sorted job order: chief, ps, worker.
    assert spec.jobs == {"chief": ["node07:7000"], "worker": ["node08:7000", "node08:7001"],
                         "ps": ["node07:7001"]}
    assert spec.task == "ps:0"


def test_tf_config_wins_and_single_task_steps_are_not_clusters(slurm_step):
    slurm_step.setenv("TF_CONFIG", '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", '
                                   '"index": 0}}')
    assert cluster().source == "TF_CONFIG"
    slurm_step.delenv("TF_CONFIG")
    slurm_step.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert not in_slurm_step() and not cluster().is_distributed


@pytest.mark.parametrize("name,value,field,words", [
    ("KDIST_SLURM_ROLES", "chief=1,worker=1", "KDIST_SLURM_ROLES", "2 tasks for a step of 4"),
    ("KDIST_SLURM_ROLES", "trainer=4", "KDIST_SLURM_ROLES.trainer", "unknown job"),
    ("KDIST_SLURM_ROLES", "worker", "KDIST_SLURM_ROLES", "ROLE=COUNT"),
    ("KDIST_SLURM_PORT", "http", "KDIST_SLURM_PORT", "bad port"),
    ("SLURM_STEP_NODELIST", "", "SLURM_STEP_NODELIST", "srun"),
])
def test_bad_slurm_settings_name_the_variable(slurm_step, name, value, field, words):
    slurm_step.setenv(name, value)
    with pytest.raises(ClusterSpecError) as info:
        cluster()
    assert info.value.field == field and words in str(info.value)


def _two_free_ports():
    while True:
        port = portpicker.pick_unused_port()
        with socket.socket() as probe:
            try:
                probe.bind(("", port + 1))
                return port
            except OSError:
                continue


def test_a_two_task_step_trains_the_example_with_multi_worker_mirrored():
    """What `srun --ntasks=2 python examples/mnist_multiworker.py` does on one node."""
    step = {**STEP, "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "localhost",
            "SLURM_STEP_TASKS_PER_NODE": "2", "KDIST_SLURM_PORT": str(_two_free_ports())}
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    tasks = [subprocess.Popen([sys.executable, "examples/mnist_multiworker.py", "--data=digits",
                               "--epochs=1"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              env={**base, **QUIET_TF, **step, "SLURM_PROCID": str(rank)})
             for rank in range(2)]
    try:
        outputs = [task.communicate(timeout=scaled(180))[0] for task in tasks]
    finally:
        for task in tasks:
            task.kill()
            task.wait()
    assert [t.returncode for t in tasks] == [0, 0], outputs
    assert "2 replica(s)" in outputs[0] and "test accuracy" in outputs[0]
