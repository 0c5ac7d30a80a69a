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


# ------------------------------------------------------------------ a real Slurm cluster
@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """munged, slurmctld and two slurmd nodes (n1, n2) sharing 127.0.0.1; skipped where Slurm
    is not installed, except in CI (.ci/run installs it and sets KDIST_REQUIRE_SLURM)."""
    import slurm_cluster

    absent = slurm_cluster.missing()
    if absent:
        if os.environ.get("KDIST_REQUIRE_SLURM"):
            pytest.fail(f"Slurm is not installed ({', '.join(absent)} missing): apt-get install "
                        "slurmctld slurmd slurm-client munge")
        pytest.skip(f"Slurm is not installed ({', '.join(absent)} missing)")
    cluster = slurm_cluster.SlurmCluster(str(tmp_path_factory.mktemp("slurm"))).start(scaled(60))
    yield cluster
    cluster.stop()
    import psutil

    left = [p for p in psutil.process_iter(["cmdline"])
            if cluster.folder in " ".join(p.info["cmdline"] or [])]
    for process in left:
        process.kill()
    assert not left, f"Slurm processes left running: {[p.info['cmdline'][:3] for p in left]}"


def _accuracy(output: str, epochs: int) -> float:
    import re

    found = re.findall(rf"uci_digits: test accuracy (\S+) after {epochs} epochs, 2 replica", output)
    assert len(found) == 1, output[-3000:]
    return float(found[0])


@pytest.fixture(scope="module")
def launcher_accuracy():
    """The same training on the local launcher (`kdist launch`'s two workers)."""
    result = subprocess.run([sys.executable, "examples/mnist_multiworker.py", "--data=digits",
                             "--epochs=3", "--timeout=240"], cwd=ROOT, capture_output=True,
                            text=True, timeout=scaled(300), env={**os.environ, **QUIET_TF})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return _accuracy(result.stdout, 3)


def test_srun_on_two_nodes_sharing_a_host_trains_like_the_local_launcher(slurm, launcher_accuracy):
    """`srun -N2 --ntasks-per-node=1`: both nodes are 127.0.0.1, one task each; kdist gives them
    ports 8888-style base + their slot on the host (base and base + 1), so both bind."""
    port = _two_free_ports()
    result = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                        sys.executable, "examples/mnist_multiworker.py", "--data=digits",
                        "--epochs=3"], cwd=ROOT, timeout=scaled(300),
                       env={**QUIET_TF, "KDIST_SLURM_PORT": str(port)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"srun: accuracy {_accuracy(result.stdout, 3):.4f}, kdist launch {launcher_accuracy:.4f}")
    assert abs(_accuracy(result.stdout, 3) - launcher_accuracy) < 0.05


def test_sbatch_runs_the_example_through_kdist(slurm, tmp_path, launcher_accuracy):
    script = tmp_path / "train.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --output={tmp_path}/slurm-%j.out
export KDIST_SLURM_PORT={_two_free_ports()} TF_CPP_MIN_LOG_LEVEL=2
cd {ROOT}
srun --kill-on-bad-exit=1 {sys.executable} examples/mnist_multiworker.py --data=digits --epochs=3
""")
    result = slurm.run(["sbatch", "--wait", str(script)], timeout=scaled(300))
    output = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert result.returncode == 0, result.stderr + output[-3000:]
    print(f"sbatch: accuracy {_accuracy(output, 3):.4f}, kdist launch {launcher_accuracy:.4f}")
    assert abs(_accuracy(output, 3) - launcher_accuracy) < 0.05


def _steps(folder, task):
    import json

    return [json.loads(line) for line in (folder / f"steps-{task}.jsonl").read_text().splitlines()]


def test_a_killed_task_restarts_the_step_and_it_resumes_from_the_backup(slurm, tmp_path):
    """The documented pattern: srun --kill-on-bad-exit=1 stops the step when one task dies, the
    batch script starts the step again (KDIST_RESTART_COUNT = the attempt), and
    BackupAndRestore resumes at the saved step: worker 1 SIGKILLed after step 7 of epoch 0,
    saved at step 5, the second attempt trains from step 6."""
    script = tmp_path / "train.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --output={tmp_path}/slurm-%j.out
export KDIST_SLURM_PORT={_two_free_ports()} TF_CPP_MIN_LOG_LEVEL=2
cd {ROOT}
for attempt in 0 1 2; do
  KDIST_RESTART_COUNT=$attempt srun --kill-on-bad-exit=1 {sys.executable} \\
    tests/programs/fault_job.py {tmp_path} --epochs 2 --save-freq 5 \\
    --fault worker:1:0:0:7:KILL && exit 0
done
exit 1
""")
    result = slurm.run(["sbatch", "--wait", str(script)], timeout=scaled(400))
    output = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert result.returncode == 0, result.stderr + output[-3000:]
    steps = _steps(tmp_path, "worker:0")
    first_of_restart = next(s for s in steps if s["restart"] == 1)
    assert (first_of_restart["epoch"], first_of_restart["step"]) == (0, 6)
    assert max(s["restart"] for s in steps) == 1


def test_a_requeued_job_resumes_from_the_backup(slurm, tmp_path):
    """sbatch --requeue, worker 0 frozen (SIGSTOP) after step 8 of epoch 0, the job requeued
    (`scontrol requeue`): the job runs again (SLURM_RESTART_COUNT=1) and resumes at the step its
    backup saved (5), then completes."""
    import time

    script = tmp_path / "train.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --requeue --output={tmp_path}/slurm-%j-%s.out --open-mode=append
export KDIST_SLURM_PORT={_two_free_ports()} TF_CPP_MIN_LOG_LEVEL=2
export KDIST_RESTART_COUNT=${{SLURM_RESTART_COUNT:-0}}
cd {ROOT}
srun --kill-on-bad-exit=1 {sys.executable} tests/programs/fault_job.py {tmp_path} --epochs 2 \\
  --save-freq 5 --fault worker:0:0:0:8:STOP
""")
    submitted = slurm.run(["sbatch", "--parsable", str(script)])
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + scaled(240)
    while not (tmp_path / "fault-worker:0.json").exists():
        assert time.monotonic() < deadline, slurm.job_state(job)
        time.sleep(0.5)
    assert slurm.run(["scontrol", "requeue", job]).returncode == 0
    # Slurm holds a requeued job back for a while (Reason=BeginTime, about 2 minutes): once it
    # is pending again, let it start now (an update made while the job still completes is lost).
    deadline = time.monotonic() + scaled(60)
    while slurm.job_state(job) != "RUNNING" and "Reason=BeginTime" not in \
            slurm.run(["scontrol", "show", "job", job, "-o"]).stdout:
        assert time.monotonic() < deadline, slurm.job_state(job)
        time.sleep(0.5)
    slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    assert slurm.wait_for_job(job, scaled(400)) == "COMPLETED", \
        "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))[-3000:]
    steps = _steps(tmp_path, "worker:0")
    restarted = [s for s in steps if s["restart"] == 1]
    assert (restarted[0]["epoch"], restarted[0]["step"]) == (0, 6)
    assert (tmp_path / "result-worker:0.json").exists()
