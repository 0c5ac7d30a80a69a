"""A task's own failure record (kdist.failure): where kdist does not launch (Kubernetes, Slurm,
Ray), the task says why it failed where its platform shows it."""

import json
import os
import subprocess
import sys

import pytest

from conftest import QUIET_TF, ROOT
from kdist import envvars, failure
from kdist.cluster.spec_file import read_k8s_spec
from kdist.k8s import render


def test_an_uncaught_exception_leaves_a_record_and_one_line(tmp_path):
    record = tmp_path / "record.json"
    tf_config = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                            "task": {"type": "worker", "index": 1}})
    result = subprocess.run([sys.executable, "-c", "import kdist\nraise KeyError('labels')"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **QUIET_TF, "TF_CONFIG": tf_config,
                                 "KDIST_EAGER_MULTI_WORKER": "0",
                                 envvars.FAILURE_FILE: str(record)})
    assert result.returncode == 1
    assert "kdist: task worker:1 failed: KeyError: 'labels'" in result.stderr
    assert result.stderr.rstrip().endswith("KeyError: 'labels'")  # Python's traceback follows
    saved = json.loads(record.read_text())
    assert (saved["task"], saved["type"], saved["message"]) == ("worker:1", "KeyError", "'labels'")
    assert saved["traceback"][-1] == "KeyError: 'labels'"


CYTHON_ASIDE_THEN_FAILURE = """
import sys
import kdist
try:  # what Cython does with an error its __dealloc__ cannot raise: h5py after a failed write
    exec(compile("raise RuntimeError('decrement id ref count')", "h5py/_objects.pyx", "exec"))
except RuntimeError as aside:
    sys.excepthook(RuntimeError, aside, aside.__traceback__.tb_next)
raise OSError(28, "no space left to write backup")
"""


def test_an_error_cython_prints_on_the_way_is_not_the_record(tmp_path):
    record = tmp_path / "record.json"
    result = subprocess.run([sys.executable, "-c", CYTHON_ASIDE_THEN_FAILURE], cwd=ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, **QUIET_TF, envvars.FAILURE_FILE: str(record)})
    assert result.returncode == 1
    assert "RuntimeError: decrement id ref count" in result.stderr  # Python still prints it
    assert [line for line in result.stderr.splitlines() if line.startswith("kdist: task")] == \
        ["kdist: task local failed: OSError: [Errno 28] no space left to write backup"]
    assert json.loads(record.read_text())["type"] == "OSError"


def test_ctrl_c_leaves_no_record(tmp_path):
    record = tmp_path / "record.json"
    result = subprocess.run([sys.executable, "-c", "import kdist\nraise KeyboardInterrupt"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **QUIET_TF, envvars.FAILURE_FILE: str(record)})
    assert result.returncode != 0 and not record.exists() and "kdist: task" not in result.stderr


def test_the_kubernetes_termination_message_gets_the_line_and_the_traceback(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setattr(failure, "TERMINATION_LOG", str(log))
    monkeypatch.delenv(envvars.FAILURE_FILE, raising=False)
    try:
        raise ValueError("no such column 'price'")
    except ValueError as error:
        failure.write(failure.record_of(error, task="worker:0"))
    text = log.read_text()
    assert text.startswith("kdist: task worker:0 failed: ValueError: no such column 'price'\n")
    assert "Traceback" in text and len(text.encode()) <= failure.TERMINATION_LIMIT


@pytest.mark.parametrize("fmt", render.FORMATS)
def test_rendered_pods_fall_back_to_the_logs_end_for_their_termination_message(fmt):
    spec = read_k8s_spec("cluster_specs/k8s-mwms.yaml")
    documents = render.render(spec, ["python", "train.py"], image="registry/train:1", fmt=fmt)
    containers = [c for d in documents for c in _containers(d)]
    assert containers and all(c["terminationMessagePolicy"] == "FallbackToLogsOnError"
                              for c in containers)


def _containers(value):
    if isinstance(value, dict):
        if "containers" in value:
            yield from value["containers"]
        for child in value.values():
            yield from _containers(child)
    elif isinstance(value, list):
        for child in value:
            yield from _containers(child)


@pytest.mark.parametrize("message, named", [
    ("Collective ops is aborted by: The following tasks are unhealthy (stopped sending "
     "heartbeats):\n/job:worker/replica:0/task:1\n/job:worker/replica:0/task:2\nThe tasks have "
     "crashed.", "worker:1 (10.0.0.2:2222), worker:2 (10.0.0.3:2222) each stopped sending"),
    ("Task /job:worker/replica:0/task:2 heartbeat timeout. This indicates that the remote task "
     "has failed", "worker:2 (10.0.0.3:2222) stopped sending"),
    ("Deadline Exceeded\nRPC: /xla.coordination.CoordinationService/Heartbeat",
     "worker:0 (10.0.0.1:2222), which runs TensorFlow's coordination service, stopped")],
    ids=["two unhealthy (TF 2.17-2.22)", "heartbeat timeout", "the service lost (TF 2.22)"])
def test_a_lost_peer_is_named_on_the_records_first_line(monkeypatch, message, named):
    """TensorFlow names a lost task on the line under its error, as /job:worker/replica:0/task:N
    (its messages on TF 2.17-2.22), or only the heartbeat's RPC; the headline says which task."""
    tf_config = {"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]},
                 "task": {"type": "worker", "index": 1 if "RPC" in message else 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    record = failure.record_of(RuntimeError(message))
    assert record["headline"].startswith(f"RuntimeError: {named}"), record["headline"]
    assert record["message"] == message
