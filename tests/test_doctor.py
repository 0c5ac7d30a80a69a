"""`kdist doctor`: what this process would run with, checked; exit code 1 on a problem."""

import json
import os
import socket

import portpicker

from conftest import ROOT, run_kdist


def doctor(*args, **env):
    result = run_kdist(["doctor", "--json", *args], timeout=120,
                       env={k: v for k, v in dict(os.environ, **env).items() if v is not None})
    assert "WARNING: All log messages before absl" not in result.stderr  # TF's C++ logs left out
    assert "cudart_stub.cc" not in result.stderr, result.stderr
    return result.returncode, {c["name"]: c for c in json.loads(result.stdout)["checks"]}


def test_a_broken_tf_config_is_a_problem_named_with_its_fix():
    code, checks = doctor(TF_CONFIG="{bad")
    assert code == 1
    assert checks["cluster"]["status"] == "problem"
    assert checks["cluster"]["detail"].startswith("TF_CONFIG: not valid JSON")
    assert "JSON object" in checks["cluster"]["fix"]
    assert checks["versions"]["status"] == "ok"  # the other checks still ran


def test_a_tf1_master_job_is_a_problem():
    code, checks = doctor(TF_CONFIG=json.dumps({"cluster": {"master": ["127.0.0.1:2222"]},
                                                "task": {"type": "master", "index": 0}}))
    assert code == 1 and "rename the job to 'chief'" in checks["cluster"]["fix"]


def test_the_resolved_cluster_the_ports_and_the_peers():
    """A valid TF_CONFIG: the task and addresses are printed, this task's free port is ok, a
    listening peer answers and a silent one is a warning (the job may not run yet): exit 0.
    Then this task's port taken: a problem, exit 1."""
    own, up, down = (portpicker.pick_unused_port() for _ in range(3))
    workers = [f"127.0.0.1:{own}", f"127.0.0.1:{up}", f"127.0.0.1:{down}"]
    tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}})
    with socket.create_server(("127.0.0.1", up)):
        code, checks = doctor(TF_CONFIG=tf_config)
    assert code == 0, checks
    assert checks["cluster"]["detail"] == f"from TF_CONFIG: this is task worker:0 of worker: " \
                                          f"{', '.join(workers)}"
    assert checks["ports"]["status"] == "ok"
    assert checks["peers"]["status"] == "warning"
    assert checks["peers"]["detail"] == f"1 of 2 peer port(s) do not answer (127.0.0.1:{down}: " \
                                        "connection refused)"
    with socket.create_server(("", own)):
        code, checks = doctor(TF_CONFIG=tf_config)
    assert code == 1 and checks["ports"]["status"] == "problem"
    assert f"port {own} of task worker:0 is taken on this host" in checks["ports"]["detail"]


def test_a_slurm_step_is_resolved_without_tf_config():
    code, checks = doctor(TF_CONFIG=None, SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="2",
                          SLURM_STEP_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="2",
                          KDIST_SLURM_PORT=str(portpicker.pick_unused_port()))
    assert checks["cluster"]["status"] == "ok", checks["cluster"]
    assert checks["cluster"]["detail"].startswith("from the Slurm step (SLURM_* variables): this "
                                                  "is task worker:1 of worker: ")


def test_a_bad_spec_file_is_a_problem(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text('{"roles": {"worker": 2}, "volume": []}')
    code, checks = doctor("--spec", str(spec), TF_CONFIG=None)
    assert code == 1 and checks["spec"]["detail"] == f"{spec}.volume: unknown key"
    code, checks = doctor("--spec", os.path.join(ROOT, "cluster_specs", "local-ps.json"),
                          TF_CONFIG=None)
    assert code == 0 and checks["spec"]["status"] == "ok"


def test_the_text_report_ends_with_its_verdict():
    result = run_kdist(["doctor"], timeout=120, env=dict(os.environ, TF_CONFIG="{bad"))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("problem  cluster: TF_CONFIG: not valid JSON") and " Fix: " in lines[0]
    assert lines[-1] == "1 problem(s)"


def test_keras_and_keras_nightly_both_installed_is_a_warning(tmp_path):
    """A second distribution of the keras package (as TensorFlow 2.22's keras-nightly next to an
    older keras): its metadata on the path is what pip would leave."""
    from importlib import metadata

    present = "keras" if "keras-nightly" in {d.metadata["Name"] for d in
                                             metadata.distributions()} else "keras-nightly"
    info = tmp_path / f"{present.replace('-', '_')}-3.99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {present}\nVersion: 3.99.0\n")
    code, checks = doctor(PYTHONPATH=str(tmp_path), TF_CONFIG=None)
    assert code == 0 and checks["keras"]["status"] == "warning"
    assert "are installed; they write the same package" in checks["keras"]["detail"]
    assert "3.99.0" in checks["keras"]["detail"]


def test_a_healthy_machine_gets_one_line_of_workarounds_and_the_list_with_verbose():
    short = run_kdist(["doctor"], timeout=120)
    long = run_kdist(["doctor", "--verbose"], timeout=120)
    assert short.returncode == long.returncode == 0, short.stdout + short.stderr
    line = next(line for line in short.stdout.splitlines() if " workarounds: " in line)
    assert "fixes of upstream bugs and" in line and "`kdist doctor --verbose` lists them" in line
    assert "model_files_written_whole" not in short.stdout
    assert len(short.stdout.splitlines()) <= 8, short.stdout
    assert "  model_files_written_whole " in long.stdout and "  gradient_exchange " in long.stdout
