"""A task whose peers do not start (kdist.startup): it says whom it waits for within seconds,
obeys SIGTERM and Ctrl-C at once, and gives up at its deadline with exit code 69 naming them; a
port already taken is named; and once training runs, SIGTERM still ends a task (TensorFlow's
SIGTERM recorder is undone). Real processes with a multi-worker TF_CONFIG whose worker 0 never
starts, running a plain Keras program that only imports kdist (tests/programs/plain_fit.py)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import portpicker
import pytest

from conftest import QUIET_TF, ROOT, scaled

PROGRAM = os.path.join(ROOT, "tests", "programs", "plain_fit.py")


def tf_config(ports, index):
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def as_in_a_terminal():
    """Ctrl-C's default action, as a program started in a terminal has it. A test run started in
    the background (`nohup ... &`, as CI machines may) ignores SIGINT, and its children inherit
    that: Python then keeps SIGINT ignored, and the Ctrl-C test would wait in vain."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(ports, index, epochs=1, **env):
    return subprocess.Popen([sys.executable, PROGRAM, str(epochs)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=as_in_a_terminal,
                            env={**os.environ, **QUIET_TF, "TF_CONFIG": tf_config(ports, index),
                                 **env})


def read_until(process, words, timeout):
    """The lines `process` printed until one holds `words` (fails after `timeout` seconds)."""
    lines, deadline = [], time.monotonic() + scaled(timeout)
    os.set_blocking(process.stdout.fileno(), False)
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line:
            lines.append(line)
            if words in line:
                return lines
        elif process.poll() is not None:
            break
        else:
            time.sleep(0.05)
    raise AssertionError(f"no {words!r} in:\n{''.join(lines)[-3000:]}")


@pytest.fixture
def ports():
    return [portpicker.pick_unused_port() for _ in range(2)]


def test_a_missing_peer_is_named_within_seconds_and_the_deadline_exits_69(ports):
    started = time.monotonic()
    alone = start(ports, 1, KDIST_STARTUP_TIMEOUT="8")
    try:
        said = read_until(alone, "has waited", timeout=30)[-1]
        waiting = f"waiting for worker:0 at 127.0.0.1:{ports[0]} (connection refused)"
        assert f"kdist: worker:1 has waited 3 s for the workers of MultiWorkerMirroredStrategy: " \
               f"{waiting}; started: worker:1 (this task)" in said
        lines = read_until(alone, "gave up", timeout=30)
        assert alone.wait(timeout=scaled(30)) == 69
    finally:
        alone.kill()
        alone.wait()
    error = lines[-1]
    assert f"kdist: error: worker:1 gave up after 8 s waiting for the workers of " \
           f"MultiWorkerMirroredStrategy: worker:0 at 127.0.0.1:{ports[0]} (connection refused). " \
           "Fix: start every task TF_CONFIG names" in error and "KDIST_STARTUP_TIMEOUT" in error
    assert time.monotonic() - started < scaled(40)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_end_the_wait_at_once(ports, sig):
    alone = start(ports, 1)
    try:
        read_until(alone, "has waited", timeout=30)
        sent = time.monotonic()
        alone.send_signal(sig)
        code = alone.wait(timeout=scaled(10))
    finally:
        alone.kill()
        alone.wait()
    assert time.monotonic() - sent < scaled(3)
    assert code == -sig  # Ctrl-C: KeyboardInterrupt, which Python ends with SIGINT


def test_a_taken_port_is_named_with_the_fix(ports):
    holder = socket.create_server(("", ports[1]))
    try:
        alone = start(ports, 1)
        output, _ = alone.communicate(timeout=scaled(60))
    finally:
        holder.close()
    assert alone.returncode == 1
    assert f"TF_CONFIG.cluster.worker[1]: port {ports[1]} of task worker:1 is taken on this host" \
           in output and "Fix: stop what holds it (ss -ltnp)" in output


def test_two_tasks_given_one_index_are_both_told_at_once(ports):
    """Both processes start as worker:0 and nobody as worker:1: the second finds the port taken
    by a process that started as worker:0 too, and the first, which waits for worker:1, hears it
    from the second; both name the index and the fix within seconds (not the 600 s deadline)."""
    first = start(ports, 0)
    try:
        read_until(first, "has waited", timeout=60)  # it holds its port and waits for worker:1
        second = start(ports, 0)
        try:
            second_output, _ = second.communicate(timeout=scaled(60))
            first_output, _ = first.communicate(timeout=scaled(20))
        finally:
            second.kill()
    finally:
        first.kill()
        first.wait()
    for output, process in ((first_output, first), (second_output, second)):
        assert process.returncode == 1, output[-3000:]
        assert "TF_CONFIG.task: " in output and "two tasks were given the index 0" in output
        assert "Fix: give each task its own index (task.index 0 to 1 for worker)" in output
    assert f"port {ports[0]} of task worker:0 is taken on this host" in second_output
    assert "by a process that started as worker:0 too" in second_output
    assert "started as worker:0 on this host while this one waited for worker:1" in first_output


def test_once_training_runs_sigterm_still_ends_a_task(ports):
    """TensorFlow's coordination service swaps the process's SIGTERM handler for one that only
    records the signal; kdist puts the program's back after start-up."""
    workers = [start(ports, i, epochs=100000) for i in (0, 1)]
    try:
        for worker in workers:
            read_until(worker, "epoch 2", timeout=120)
        sent = time.monotonic()
        workers[1].send_signal(signal.SIGTERM)
        assert workers[1].wait(timeout=scaled(15)) == -signal.SIGTERM
        assert time.monotonic() - sent < scaled(3)
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
