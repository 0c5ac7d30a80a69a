"""`kdist launch`: real child processes, real signals, nothing left behind."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from conftest import ROOT, run_kdist, run_python, scaled
from kdist.launch.config import LaunchConfig
from kdist.launch.policy import Attempt, Decision, after_failure

TASK = os.path.join(ROOT, "tests", "programs", "task.py")


def launch(tmp_path, roles, *rules, timeout=60, extra=()):
    result = run_kdist(["launch", *roles, *extra, "--", sys.executable, TASK, str(tmp_path), *rules],
                       timeout=timeout)
    return result


def pids(tmp_path):
    return {p.name[:-4]: int(p.read_text()) for p in tmp_path.glob("*.pid")}


def assert_all_gone(tmp_path, expected):
    found = pids(tmp_path)
    assert sorted(found) == sorted(expected)
    alive = [task for task, pid in found.items() if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"still running: {alive}"


def test_every_line_is_prefixed_and_every_task_gets_its_tf_config(tmp_path):
    result = launch(tmp_path, ["--chief", "--workers", "2"], "*=print")
    assert result.returncode == 0, result.stdout + result.stderr
    configs = {}
    for line in result.stdout.splitlines():
        assert line.startswith(("[kdist] ", "[chief-0] ", "[worker-0] ", "[worker-1] ")), line
        prefix, _, text = line.partition(" ")
        if text.startswith("{"):
            configs[prefix] = json.loads(text)
    assert sorted(configs) == ["[chief-0]", "[worker-0]", "[worker-1]"]
    assert configs["[worker-1]"]["task"] == {"type": "worker", "index": 1}
    cluster = configs["[chief-0]"]["cluster"]
    assert all(c["cluster"] == cluster for c in configs.values())
    addresses = cluster["chief"] + cluster["worker"]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)


def test_a_failing_task_stops_the_rest_and_its_code_is_the_exit_code(tmp_path):
    started = time.monotonic()
    result = launch(tmp_path, ["--workers", "3"], "worker:1=exit3", "*=sleep")
    assert result.returncode == 3, result.stdout
    assert time.monotonic() - started < 30
    assert "worker-1 exited with code 3: stopping the other tasks" in result.stdout
    assert_all_gone(tmp_path, ["worker:0", "worker:1", "worker:2"])


def test_leader_success_stops_servers_that_do_not_exit(tmp_path):
    result = launch(tmp_path, ["--chief", "--workers", "2", "--ps", "2"], "chief:0=wait1", "*=sleep",
                    extra=["--grace", "1"])
    assert result.returncode == 0, result.stdout
    assert "chief-0 succeeded" in result.stdout
    assert "grace period over: stopping worker-0, worker-1, ps-0, ps-1" in result.stdout
    assert_all_gone(tmp_path, ["chief:0", "worker:0", "worker:1", "ps:0", "ps:1"])


def test_a_dead_worker_does_not_stop_parameter_server_training(tmp_path):
    result = launch(tmp_path, ["--chief", "--workers", "2", "--ps", "1"], "worker:1=exit9",
                    "chief:0=wait2", "*=exit0")
    assert result.returncode == 0, result.stdout
    assert "worker-1 exited with code 9; parameter-server training goes on without it" in \
        result.stdout


def test_a_dead_ps_fails_parameter_server_training_with_the_chiefs_code(tmp_path):
    result = launch(tmp_path, ["--chief", "--workers", "1", "--ps", "1"], "ps:0=exit7",
                    "chief:0=exit3@1", "*=sleep")
    assert result.returncode == 3, result.stdout
    assert "ps-0 exited with code 7: waiting up to 30s for the chief to report it" in result.stdout
    assert "chief-0 exited with code 3: stopping the other tasks" in result.stdout


def test_a_dead_ps_fails_the_job_if_the_chief_does_not_report_it(tmp_path):
    result = launch(tmp_path, ["--chief", "--workers", "1", "--ps", "1"], "ps:0=exit7", "*=sleep",
                    extra=["--grace", "1"])
    assert result.returncode == 7 and "ps-0 exited with code 7: stopping" in result.stdout


def test_workers_get_a_grace_period_after_the_leader(tmp_path):
    result = launch(tmp_path, ["--workers", "2"], "worker:1=wait2", "*=exit0", extra=["--grace", "20"])
    assert result.returncode == 0 and "grace period over" not in result.stdout
    result = launch(tmp_path, ["--workers", "2"], "worker:1=sleep", "*=exit0", extra=["--grace", "1"])
    assert result.returncode == 0 and "grace period over: stopping worker-1" in result.stdout
    assert_all_gone(tmp_path, ["worker:0", "worker:1"])


def test_a_failure_after_the_leader_succeeded_is_logged(tmp_path):
    result = launch(tmp_path, ["--workers", "2"], "worker:1=exit3@1", "*=exit0")
    assert result.returncode == 0
    assert "worker-1 exited with code 3 after the leader succeeded" in result.stdout


def test_timeout_shows_where_each_task_hangs_then_stops_everything_with_code_124(tmp_path):
    # worker 0 imported kdist: it answers with its stacks; worker 1 did not: it ends on the request
    result = launch(tmp_path, ["--workers", "2"], "worker:0=hang", "*=sleep",
                    extra=["--timeout", "5"])
    # The suite scales `--timeout` with the machine's slowdown (conftest.run_python): 5s or more.
    assert result.returncode == 124 and re.search(r"timed out after \d+s: every task's Python "
                                                  r"stacks follow", result.stdout), result.stdout
    stacks = [line for line in result.stdout.splitlines() if line.startswith("[worker-0] ")]
    assert any("in waiting_for_a_peer_that_never_answers" in line for line in stacks), stacks
    for task in ("worker-0", "worker-1"):
        assert re.search(rf"{task}: stopped by kdist because the job timed out", result.stdout)
    assert_all_gone(tmp_path, ["worker:0", "worker:1"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_launcher_cleans_up_every_child(tmp_path, sig):
    launcher = subprocess.Popen([sys.executable, "-m", "kdist", "launch", "--workers", "2", "--",
                                 sys.executable, TASK, str(tmp_path), "*=sleep"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_pids(tmp_path, 2)
        launcher.send_signal(sig)
        output, _ = launcher.communicate(timeout=scaled(30))
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + sig, output
    assert f"received {signal.Signals(sig).name}" in output
    assert_all_gone(tmp_path, ["worker:0", "worker:1"])


def test_children_die_with_a_killed_launcher(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-m", "kdist", "launch", "--workers", "2", "--",
                                 sys.executable, TASK, str(tmp_path), "*=sleep"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_pids(tmp_path, 2)
    launcher.kill()  # SIGKILL: no handler runs; the kernel's parent-death signal must do the job
    launcher.wait(timeout=scaled(10))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids(tmp_path).values()):
        time.sleep(0.1)
    assert_all_gone(tmp_path, ["worker:0", "worker:1"])


@pytest.mark.parametrize("args,words", [
    (["--spec", "cluster_specs/local-2-workers.json", "--workers", "2", "--", "true"],
     "either with --spec or with the role flags"),
    (["--workers", "2"], "command: empty"),
    (["--spec", "nope.json", "--", "true"], "no such file"),
    (["--chief", "--workers", "0", "--ps", "1", "--", "true"], "needs a worker"),
])
def test_bad_launch_arguments_exit_2_with_a_message(args, words):
    result = run_kdist(["launch", *args], timeout=30)
    assert result.returncode == 2 and words in result.stderr


def test_a_spec_with_no_task_on_this_machine_is_refused_naming_its_hosts(tmp_path):
    spec = tmp_path / "remote.json"  # 192.0.2.0/24: documentation addresses, never this machine's
    spec.write_text('{"cluster": {"worker": ["192.0.2.5:2222", "192.0.2.6:2222"]}}')
    result = run_kdist(["launch", "--spec", str(spec), "--", "true"], timeout=30)
    assert result.returncode == 2, result.stderr
    assert "none of the cluster's hosts is an address of this machine (hosts: 192.0.2.5, " \
           "192.0.2.6)" in result.stderr and "--host" in result.stderr
    result = run_kdist(["launch", "--spec", str(spec), "--host", "192.0.2.9", "--", "true"],
                       timeout=30)
    assert result.returncode == 2 and "no task of the cluster is on host '192.0.2.9'" in \
        result.stderr


def test_a_multi_host_spec_refuses_restarts_and_a_private_network(tmp_path):
    spec = tmp_path / "two.json"
    spec.write_text('{"cluster": {"worker": ["127.0.0.1:2222", "192.0.2.6:2222"]}}')
    result = run_kdist(["launch", "--spec", str(spec), "--max-restarts", "1", "--", "true"],
                       timeout=30)
    assert result.returncode == 2 and "a restart needs every machine's tasks" in result.stderr
    spec.write_text('{"cluster": {"worker": ["192.0.2.5:2222", "192.0.2.6:2222"]}}')
    result = run_kdist(["launch", "--spec", str(spec), "--host", "192.0.2.5", "--network",
                        "private", "--", "true"], timeout=30)
    assert result.returncode == 2 and "a private network (a loopback only)" in result.stderr


def test_launch_from_spec_file(tmp_path):
    result = launch(tmp_path, ["--spec", "cluster_specs/local-chief-2-workers.json"], "*=exit0")
    assert result.returncode == 0
    assert sorted(pids(tmp_path)) == ["chief:0", "worker:0", "worker:1"]


def test_the_command_line_does_not_import_tensorflow():
    """`import kdist` (and so `kdist launch`/`validate`) stays light: no TensorFlow, no Keras."""
    from conftest import run_python

    result = run_python(["-c", "import sys, kdist, kdist.cli, kdist.launch, kdist.cluster.spec_file; "
                               "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"],
                        timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def wait_for_pids(directory, count, timeout=20):
    deadline = time.monotonic() + timeout
    while len(list(directory.glob("*.pid"))) < count:
        assert time.monotonic() < deadline, "tasks did not start"
        time.sleep(0.05)


def test_max_restarts_restarts_the_whole_group_and_tells_the_tasks(tmp_path):
    result = launch(tmp_path, ["--workers", "2"], "worker:1@0=exit3", "worker:0@0=sleep",
                    "*=print", extra=["--max-restarts", "2"])
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert "worker-1 exited with code 3: stopping the other tasks" in out
    assert "restarting every task (1/2); they see KDIST_RESTART_COUNT=1" in out
    assert "[worker-0] task worker:0 does sleep on restart 0" in out
    assert "[worker-0] task worker:0 does print on restart 1" in out
    assert "(2/2)" not in out
    assert_all_gone(tmp_path, ["worker:0", "worker:1"])


def test_a_group_that_keeps_failing_exits_with_the_code_after_its_restarts(tmp_path):
    result = launch(tmp_path, ["--workers", "2"], "worker:1=exit3", "*=sleep",
                    extra=["--max-restarts", "2"])
    assert result.returncode == 3, result.stdout
    assert "(1/2)" in result.stdout and "(2/2)" in result.stdout
    assert result.stdout.count("worker-1 exited with code 3") == 3
    assert "on restart 2" in result.stdout and "on restart 3" not in result.stdout


def test_min_workers_restarts_without_a_task_that_fails_twice_in_a_row(tmp_path):
    result = launch(tmp_path, ["--workers", "2"], "worker:1=exit3", "worker:0@0=sleep",
                    "worker:0@1=sleep", "*=print", extra=["--max-restarts", "3", "--min-workers", "1"])
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert "restarting every task (1/3); they see KDIST_RESTART_COUNT=1" in out
    assert ("worker-1 failed on two starts in a row: restarting without it on 1 worker(s) "
            "(--min-workers 1) (2/3); they see KDIST_RESTART_COUNT=2 and "
            "KDIST_WORLD_SIZE_CHANGE=2->1") in out
    assert "[worker-0] task worker:0 does sleep on restart 1, world size change none" in out
    assert "[worker-0] task worker:0 does print on restart 2, world size change 2->1" in out
    last_config = json.loads(out.split("world size change 2->1\n[worker-0] ")[1].splitlines()[0])
    assert list(last_config["cluster"]) == ["worker"] and len(last_config["cluster"]["worker"]) == 1
    assert "(3/3)" not in out


def test_min_workers_is_a_floor_then_the_job_fails_with_the_tasks_code(tmp_path):
    result = launch(tmp_path, ["--workers", "2"], "worker:1=exit3", "*=sleep",
                    extra=["--max-restarts", "2", "--min-workers", "2"])
    assert result.returncode == 3, result.stdout
    assert "restarting without" not in result.stdout and "(2/2)" in result.stdout


RESTART, STOP = Decision(restart=True), Decision(restart=False)


@pytest.mark.parametrize("config, attempt, decision", [
    ({}, Attempt(0, 2, "worker-1"), STOP),  # no restarts asked
    ({"max_restarts": 1}, Attempt(0, 2, "worker-1"), RESTART),
    ({"max_restarts": 1}, Attempt(1, 2, "worker-1", "worker-1"), STOP),  # none left
    ({"max_restarts": 3}, Attempt(1, 2, "worker-1", "worker-1"), RESTART),  # no min_workers
    ({"max_restarts": 3, "min_workers": 1}, Attempt(0, 2, "worker-1"), RESTART),  # first time
    ({"max_restarts": 3, "min_workers": 1}, Attempt(1, 2, "worker-1", "worker-1"),
     Decision(restart=True, without=("worker", 1))),  # twice in a row: a lost host
    ({"max_restarts": 3, "min_workers": 1}, Attempt(1, 2, "chief-0", "chief-0"),
     Decision(restart=True, without=("chief", 0))),
    ({"max_restarts": 3, "min_workers": 1}, Attempt(1, 2, "worker-0", "worker-1"), RESTART),
    ({"max_restarts": 3, "min_workers": 2}, Attempt(1, 2, "worker-1", "worker-1"), RESTART),
    ({"max_restarts": 3, "min_workers": 1}, Attempt(1, 2, "ps-0", "ps-0"), RESTART),
    ({"max_restarts": 3, "min_workers": 1}, Attempt(1, 2, None, None), RESTART),
])
def test_the_restart_policy_is_a_function_of_the_attempt(config, attempt, decision):
    """kdist.launch.policy: what follows a failed attempt, decided with no process or clock
    (the loop that starts and watches tasks only carries it out)."""
    assert after_failure(LaunchConfig(**config), attempt) == decision


@pytest.mark.parametrize("extra, problem", [
    (["--max-restarts", "1", "--min-workers", "3"], "3 is more than the 2 chief/worker task(s)"),
    (["--min-workers", "1"], "--max-restarts is 0"),
    (["--max-restarts", "1", "--min-workers", "1", "--ps", "1", "--chief"], "parameter-server job"),
    (["--max-restarts", "1", "--min-workers", "0"], "'0' is out of range"),
])
def test_min_workers_bad_input_names_the_flag_and_the_fix(extra, problem):
    result = run_kdist(["launch", "--workers", "2", *extra, "--", "true"], timeout=30)
    assert result.returncode == 2 and "--min-workers" in result.stderr, result.stderr
    assert problem in result.stderr


def test_max_restarts_must_be_a_count():
    result = run_kdist(["launch", "--max-restarts", "-1", "--", "true"], timeout=30)
    assert result.returncode == 2 and "--max-restarts: '-1' is out of range" in result.stderr


# ------------------------------------------------------------------ the network (issue 41)
NETNS_PROBE = "import os; print('netns', os.readlink('/proc/self/ns/net'))"


def namespaces_of(output):
    return {line.split("netns ", 1)[1] for line in output.splitlines() if "] netns " in line}


def test_a_default_launch_runs_its_tasks_in_one_private_network_namespace():
    result = run_kdist(["launch", "--workers", "2", "--", sys.executable, "-c", NETNS_PROBE],
                       timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    namespaces = namespaces_of(result.stdout)
    assert len(namespaces) == 1 and namespaces != {os.readlink("/proc/self/ns/net")}
    assert "on a private network (only they reach each other)" in result.stdout
    host = run_kdist(["launch", "--workers", "2", "--network", "host", "--", sys.executable, "-c",
                      NETNS_PROBE], timeout=60)
    assert host.returncode == 0 and namespaces_of(host.stdout) == {
        os.readlink("/proc/self/ns/net")}
    assert "private network" not in host.stdout


def test_without_unprivileged_namespaces_the_launch_warns_or_fails_as_asked(tmp_path):
    """Where unshare cannot make a namespace (here: it is not on PATH), a default launch names
    the exposed ports and the flag; --network private fails with the reason."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python")
    env = dict(os.environ, PATH=str(bin_dir))
    result = run_kdist(["launch", "--workers", "2", "--", "python", "-c", "pass"], timeout=60,
                       env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"WARNING: the tasks' TensorFlow ports \(127\.0\.0\.1:\d+, 127\.0\.0\.1:"
                     r"\d+\) are reachable from other hosts: .* No private network here: unshare "
                     r"and nsenter not on PATH \(install util-linux\)\..* --network host",
                     result.stdout), result.stdout
    asked = run_kdist(["launch", "--workers", "2", "--network", "private", "--", "python", "-c",
                       "pass"], timeout=60, env=env)
    assert asked.returncode == 2 and "--network: private: unshare and nsenter not on PATH" in \
        asked.stderr, asked.stderr


def test_private_network_ports_cannot_be_reached_from_this_host(tmp_path):
    """The namespace has only a loopback interface, and a task's port is closed to this host."""
    import socket

    launcher = subprocess.Popen([sys.executable, "-m", "kdist", "launch", "--workers", "2",
                                 "--private-network", "--", sys.executable,
                                 os.path.join(ROOT, "tests", "programs", "serve_and_wait.py"),
                                 str(tmp_path)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ports = wait_for_ports(tmp_path, 2)
        for port in ports:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        (tmp_path / "done").touch()
        output, _ = launcher.communicate(timeout=scaled(60))
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == 0, output


def test_a_task_that_needs_the_outside_network_is_told_why_it_has_none():
    download = "import urllib.request; urllib.request.urlopen('http://data.example.org/x', timeout=5)"
    result = run_kdist(["launch", "--workers", "2", "--", sys.executable, "-c", download],
                       timeout=60)
    assert result.returncode == 1
    assert "name resolution" in result.stdout or "Name or service not known" in result.stdout
    assert ("hint: the tasks ran on kdist launch's private network, which has no outside access: "
            'download what they need before the launch, or launch with network="host" (kdist '
            'launch --network host)') in result.stdout


def test_the_rootless_namespace_isolates_the_same_way():
    """What a non-root user gets (unshare --user --map-root-user, nsenter --user), run here as
    root: a namespace with only loopback, whose tasks keep their pid and get their signals."""
    from kdist.launch.private_network import PrivateNetwork

    probe = ("import os, socket, time\n"
             "server = socket.create_server(('127.0.0.1', 0))\n"
             "socket.create_connection(server.getsockname()).close()\n"
             "names = [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]]\n"
             "print(os.getpid(), os.readlink('/proc/self/ns/net'), "
             "os.readlink('/proc/self/ns/user'), names, flush=True)\n"
             "time.sleep(60)")
    with PrivateNetwork(rootless=True) as network:
        assert "--user" in network.exec_prefix()
        task = subprocess.Popen(network.exec_prefix() + [sys.executable, "-c", probe],
                                stdout=subprocess.PIPE, text=True)
        try:
            pid, net, user, names = task.stdout.readline().split(" ", 3)
            task.terminate()
            assert task.wait(timeout=10) == -signal.SIGTERM
        finally:
            task.kill()
            task.wait()
    assert int(pid) == task.pid
    assert net != os.readlink("/proc/self/ns/net") and user != os.readlink("/proc/self/ns/user")
    assert names.strip() == "['lo']"


def wait_for_ports(folder, count, timeout=60):
    deadline = time.monotonic() + scaled(timeout)
    while len(list(folder.glob("*.port"))) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    ports = [int(p.read_text()) for p in folder.glob("*.port")]
    assert len(ports) == count, f"{len(ports)} of {count} tasks listened"
    return ports


@pytest.mark.parametrize("network", ["default", "host"])
def test_another_host_cannot_reach_a_default_launchs_workers(netns, tmp_path, network):
    """Two emulated hosts: the launch runs on one (2 workers with TensorFlow's gRPC servers), the
    other tries every worker's port. By default none answers; with --network host all do."""
    from kdist.k8s import netlab

    probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], "
             "int(sys.argv[2])), timeout=3).close()\n    print('reached')\n"
             "except OSError as err:\n    print(type(err).__name__)")
    flags = ["--network", "host"] if network == "host" else []
    with netlab.Network(["laptop.test", "stranger.test"]) as lab:
        launcher = subprocess.Popen(
            lab.exec_prefix("laptop.test") + [
                sys.executable, "-m", "kdist", "launch", "--workers", "2", "--timeout", "120",
                *flags, "--", sys.executable,
                os.path.join(ROOT, "tests", "programs", "serve_and_wait.py"), str(tmp_path)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            ports = wait_for_ports(tmp_path, 2)
            answers = [subprocess.run(
                lab.exec_prefix("stranger.test") + [sys.executable, "-c", probe,
                                                    lab.addresses["laptop.test"], str(port)],
                capture_output=True, text=True, timeout=30).stdout.strip() for port in ports]
            (tmp_path / "done").touch()
            output, _ = launcher.communicate(timeout=scaled(60))
        finally:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, output
    expected = "reached" if network == "host" else "ConnectionRefusedError"
    assert answers == [expected, expected], answers


def test_evaluator_gets_its_own_task_next_to_the_training_cluster(tmp_path):
    result = launch(tmp_path, ["--workers", "2", "--evaluator"], "*=print")
    assert result.returncode == 0, result.stdout + result.stderr
    evaluator = [json.loads(line.partition(" ")[2]) for line in result.stdout.splitlines()
                 if line.startswith("[evaluator-0] {")]
    assert len(evaluator) == 1 and evaluator[0]["task"] == {"type": "evaluator", "index": 0}
    assert len(evaluator[0]["cluster"]["worker"]) == 2


# ------------------------------------------------------------------ the summary (issue 40)
def test_a_missing_script_is_named_not_called_a_bad_flag(tmp_path):
    missing = tmp_path / "no_such_train.py"
    result = run_kdist(["launch", "--workers", "2", "--timeout", "60", "--", sys.executable,
                        str(missing)], timeout=90)
    assert result.returncode == 2, result.stdout
    first = next(line for line in result.stdout.splitlines() if "first failure:" in line)
    assert "exit code 2, a usage error: " in first and "can't open file" in first and \
        str(missing) in first and "a bad flag" not in first, first


def test_the_first_failure_is_named_with_its_exception_time_and_last_lines(tmp_path):
    summary = tmp_path / "summary.json"
    result = launch(tmp_path, ["--workers", "3"], "worker:1=raise", "*=sleep",
                    extra=["--summary", str(summary)])
    assert result.returncode == 1, result.stdout
    out = result.stdout
    assert "[worker-1] kdist: task worker:1 failed: ValueError: bad shape (3, 4) for the kernel" \
        in out  # the task's own line, for platforms kdist does not launch on
    assert re.search(r"\[kdist\] summary: failed with exit code 1 after [\d.]+ s\n", out)
    assert re.search(r"\[kdist\]   first failure: worker-1 at [\d.]+ s: raised ValueError: bad "
                     r"shape \(3, 4\) for the kernel\n", out)
    assert "[kdist]     | ValueError: bad shape (3, 4) for the kernel" in out  # its last lines
    for other in ("worker-0", "worker-2"):
        assert re.search(rf"\[kdist\]   {other}: stopped by kdist because worker-1 failed at", out)
    saved = json.loads(summary.read_text())
    assert saved["state"] == "failed" and saved["exit_code"] == 1
    first = saved["first_failure"]
    assert first["task"] == "worker-1" and first["exception"]["type"] == "ValueError"
    assert first["exception"]["message"] == "bad shape (3, 4) for the kernel"
    assert first["last_lines"][-1] == "ValueError: bad shape (3, 4) for the kernel"
    assert [t["stopped_by"] for t in saved["tasks"] if t["task"] != "worker-1"] == \
        ["worker-1 failed"] * 2
    assert_all_gone(tmp_path, ["worker:0", "worker:1", "worker:2"])


def test_a_task_killed_like_the_out_of_memory_killer_is_named_with_its_signal(tmp_path):
    result = launch(tmp_path, ["--workers", "2"], "worker:0=kill9", "*=sleep")
    assert result.returncode == 137, result.stdout
    assert re.search(r"first failure: worker-0 at [\d.]+ s: killed by SIGKILL \(signal 9\): "
                     r"something outside the task killed it; the out-of-memory killer does this",
                     result.stdout)
    assert "worker-1: stopped by kdist because worker-0 failed" in result.stdout


def test_success_ends_with_every_tasks_outcome_and_the_duration(tmp_path):
    result = launch(tmp_path, ["--chief", "--workers", "1"], "*=exit0")
    assert result.returncode == 0, result.stdout
    assert re.search(r"\[kdist\] summary: succeeded with exit code 0 after [\d.]+ s\n",
                     result.stdout)
    for task in ("chief-0", "worker-0"):
        assert re.search(rf"\[kdist\]   {task}: succeeded at [\d.]+ s", result.stdout)


def test_restarts_are_counted_and_the_summary_tells_the_earlier_failure(tmp_path):
    """worker-0 serves until worker-1 fails on the first attempt: had it exited 0 at the same
    moment, the launcher could see the leader succeed first and end without a restart (CI saw
    it once)."""
    result = launch(tmp_path, ["--workers", "2"], "worker:1@0=exit3", "worker:0@0=sleep",
                    "*=exit0", extra=["--max-restarts", "1"])
    assert result.returncode == 0, result.stdout
    assert "summary: succeeded with exit code 0 after" in result.stdout
    assert "and 1 restart(s)" in result.stdout
    assert "earlier attempt: worker-1: exit code 3" in result.stdout


def test_tensorflow_startup_noise_and_progress_bars_read_cleanly_and_logs_keep_all(tmp_path):
    logs = tmp_path / "logs"
    result = launch(tmp_path, ["--workers", "1"], "*=chatter", extra=["--log-dir", str(logs)])
    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith("[worker-0]")]
    assert lines[-3:] == ["[worker-0] Epoch 1/1", "[worker-0] 3/3 \u2501\u2501\u2501\u2501 - loss: 0.3",
                          "[worker-0] done"], lines
    assert not any(word in result.stdout for word in ("I0000", "InitializeLog", "cuInit", "\x1b"))
    whole = (logs / "worker-0.log").read_text()
    assert whole.startswith("=== kdist launch: attempt 0 of worker-0")
    assert "I0000" in whole and "cuInit" in whole and "\x1b[1m1/3" in whole  # as it came
    assert json.loads((logs / "summary.json").read_text())["state"] == "succeeded"
    kept = launch(tmp_path, ["--workers", "1"], "*=chatter", extra=["--tf-logs"])
    assert "I0000" in kept.stdout and "cuInit" in kept.stdout



# ------------------------------------------------------------------ two machines, one spec (issue 46)
def test_two_machines_train_from_one_spec_with_fixed_addresses(netns, tmp_path):
    """The TF multi-worker tutorial's case without a scheduler: two emulated machines (network
    namespaces with their own addresses), one spec naming both, `kdist launch --spec` run on each.
    Each starts only its own worker; they train as one cluster, end with the same weights, and
    match one device with the global batch."""
    from kdist.k8s import netlab

    program = os.path.join(ROOT, "tests", "programs", "two_machines_job.py")
    one_device = run_python([program, str(tmp_path)], timeout=120)
    assert one_device.returncode == 0, one_device.stderr[-3000:]
    with netlab.Network(["machine-a.test", "machine-b.test"]) as lab:
        spec = tmp_path / "two-machines.json"
        spec.write_text(json.dumps({"cluster": {"worker": [
            f"{lab.addresses['machine-a.test']}:2222", f"{lab.addresses['machine-b.test']}:2222"]}}))
        launchers = {machine: subprocess.Popen(
            lab.exec_prefix(machine) + [sys.executable, "-m", "kdist", "launch", "--spec",
                                        str(spec), "--timeout", "150", "--", sys.executable,
                                        program, str(tmp_path)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for machine in lab.hosts}
        try:
            outputs = {m: p.communicate(timeout=scaled(180))[0] for m, p in launchers.items()}
        finally:
            for process in launchers.values():
                process.kill()
                process.wait()
    for machine, process in launchers.items():
        assert process.returncode == 0, f"{machine}:\n{outputs[machine][-4000:]}"
    a, b = outputs["machine-a.test"], outputs["machine-b.test"]
    assert "started 1 task(s): worker-0=10.213.0.1:2222" in a and "[worker-0]" in a, a
    assert "started 1 task(s): worker-1=10.213.0.2:2222" in b and "[worker-0]" not in b, b
    assert "WARNING: the tasks' TensorFlow ports (10.213.0.1:2222) listen on this machine's " \
           "network" in a
    for output in (a, b):
        assert re.search(r"\[kdist\] summary: succeeded with exit code 0 after [\d.]+ s", output)
    reports = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in (0, 1)]
    assert [r["replicas"] for r in reports] == [2, 2]
    assert reports[0]["loss"] == reports[1]["loss"]
    reference = json.loads((tmp_path / "one-device.json").read_text())
    np.testing.assert_allclose(reports[0]["loss"], reference["loss"], rtol=1e-5)
    weights = [np.load(tmp_path / f"{name}.npz") for name in ("worker-0", "worker-1", "one-device")]
    for key in weights[2].files:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])
        np.testing.assert_allclose(weights[0][key], weights[2][key], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the backend seam
class FakeTask:
    """A task that runs nowhere: it ends with `code` at its `polls`-th poll (never if None)."""

    def __init__(self, task_type, index, env, code, polls=2):
        self.task_type, self.index, self.env = task_type, index, env
        self.code, self.polls = code, polls
        self.ended = self.stopped_by = self.log_path = None
        self.lines = [f"{task_type}-{index} ran"]
        self.stopped = False

    @property
    def name(self):
        return f"{self.task_type}-{self.index}"

    def poll(self):
        self.polls -= 1
        if self.stopped or (self.code is not None and self.polls <= 0):
            self.ended = self.ended or time.monotonic()
            return 143 if self.stopped and (self.code is None or self.polls > 0) else self.code
        return None

    def failure(self):
        return None


class FakeBackend:
    """A task backend in one class: each attempt's tasks end as `script[attempt][task]` says
    (an exit code, or None: runs until stopped), and it records what the launcher asked."""

    def __init__(self, script, calls):
        self.script, self.calls, self.tasks = script, calls, []

    def start(self, tasks, on_error):
        attempt = sum(1 for call in self.calls if call[0] == "start")
        self.calls.append(("start", [(t, i, env["TF_CONFIG"], env["KDIST_RESTART_COUNT"],
                                      env.get("KDIST_WORLD_SIZE_CHANGE")) for t, i, _, env in tasks]))
        plan = self.script[min(attempt, len(self.script) - 1)]
        self.tasks = [FakeTask(t, i, env, plan.get(f"{t}-{i}", 0)) for t, i, _, env in tasks]

    def ask_for_stacks(self, tasks, because):
        self.calls.append(("stacks", [t.name for t in tasks if t.poll() is None]))

    def stop(self, tasks, because):
        for task in tasks:
            if task.poll() is None:
                task.stopped, task.stopped_by = True, because
        self.calls.append(("stop", because))

    def notify(self, tasks, signum):
        self.calls.append(("notify", [t.name for t in tasks], signum))

    def close(self):
        self.stop(self.tasks, "the launcher ended")


def fake_launch(script, roles, **options):
    import io

    from kdist.cluster import ClusterSpec
    from kdist.launch import Launcher

    calls, output = [], io.StringIO()
    launcher = Launcher(ClusterSpec.local_layout(roles), [sys.executable], output=output,
                        network="host", backend=lambda: FakeBackend(script, calls), **options)
    code = launcher.run()
    return code, calls, output.getvalue(), launcher


def test_a_new_task_backend_is_one_class_and_the_launchers_policy_drives_it():
    """The launcher's restart and lost-worker policy run on a backend that starts no process:
    worker-1 fails twice in a row, the group restarts, then goes on without it."""
    fails = {"worker-1": 3, "worker-0": None}  # worker-0 runs until it is stopped
    code, calls, out, launcher = fake_launch([fails, fails, {"worker-0": 0}], {"worker": 2},
                                             max_restarts=2, min_workers=1, grace=0)
    assert code == 0, out
    starts = [call[1] for call in calls if call[0] == "start"]
    assert [[(t, i, count, change) for t, i, _, count, change in s] for s in starts] == [
        [("worker", 0, "0", None), ("worker", 1, "0", None)],
        [("worker", 0, "1", None), ("worker", 1, "1", None)],
        [("worker", 0, "2", "2->1")]]
    assert [len(json.loads(s[0][2])["cluster"]["worker"]) for s in starts] == [2, 2, 1]
    assert "restarting without it on 1 worker(s)" in out
    assert launcher.summary.restarts == 2 and launcher.summary.exit_code == 0
    assert [e.task for e in launcher.summary.tasks] == ["worker-0"]
    assert launcher.summary.earlier == ["worker-1: exit code 3"] * 2


def test_a_backend_is_asked_for_stacks_on_a_timeout_then_stopped_and_told_the_chief_is_done():
    code, calls, out, _ = fake_launch([{"worker-0": None}], {"worker": 2}, timeout=0.3)
    assert code == 124, out
    kinds = [call[0] for call in calls]
    assert kinds.index("stacks") < kinds.index("stop")
    assert calls[kinds.index("stacks")][1] == ["worker-0"]
    code, calls, out, _ = fake_launch([{"ps-0": None, "worker-0": None}],
                                      {"chief": 1, "worker": 1, "ps": 1}, grace=0)
    assert code == 0, out
    assert ("notify", ["worker-0", "ps-0"], signal.SIGUSR2) in calls


def test_the_launch_config_names_its_fields_and_the_command_line_its_flags():
    from kdist.cluster import ClusterSpec
    from kdist.launch import Launcher, LaunchConfig
    from kdist.validators import UsageError

    spec = ClusterSpec.local_layout({"worker": 2})
    with pytest.raises(UsageError, match=r"^min_workers: .*max_restarts is 0\. Fix: add "
                                         r"max_restarts N"):
        Launcher(spec, [sys.executable], min_workers=1)
    with pytest.raises(UsageError, match=r"^min_workers: 3 is more than the 2"):
        Launcher(spec, [sys.executable], LaunchConfig(max_restarts=1, min_workers=3))
    with pytest.raises(TypeError, match="no setting restarts; LaunchConfig's fields are timeout"):
        Launcher(spec, [sys.executable], restarts=1)
    with pytest.raises(TypeError, match=r"give config or its fields \(timeout\), not both"):
        Launcher(spec, [sys.executable], LaunchConfig(), timeout=5)
    result = run_kdist(["launch", "--min-workers", "1", "--", "true"], timeout=30)
    assert result.returncode == 2, result.stderr
    assert ("--min-workers: a smaller restart is a restart, and --max-restarts is 0. Fix: add "
            "--max-restarts N") in result.stderr
