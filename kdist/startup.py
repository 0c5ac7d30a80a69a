"""Waiting for the other tasks of a cluster at start-up: said within seconds, bounded, and
interruptible.

When a task builds its strategy, TensorFlow connects it to every other task of TF_CONFIG and waits
for all of them inside one call that holds Python's lock, without a word and for up to an hour
(its coordination service's default); it also replaces the process's SIGTERM handler with one
that only records the signal. Neither `timeout` nor Ctrl-C then ends the wait, and no Python
thread can report on it. So kdist meets the other tasks first, in Python (`wait_for_peers`):

- it holds this task's own port (so the others see it has started, and a port already taken on
  this host is an error at once) and connects to every other task's until all answer;
- it says within seconds which tasks it waits for, at which addresses, and what connecting to
  each gives (connection refused, no route, a name that does not resolve), then again every 30 s
  with what is known (which tasks have started);
- SIGTERM and Ctrl-C end it at once;
- at the deadline (`KDIST_STARTUP_TIMEOUT`, or `kdist.strategy(startup_timeout=...)`, default
  600 s) it stops with one error naming the missing tasks and the fix, exit code 69
  (`exit_codes.PEERS_MISSING`).

Then it releases its port to TensorFlow's server, and TensorFlow's own start-up finds everyone
there. Afterwards `signals_kept` puts the program's SIGTERM and SIGINT handlers back (TensorFlow's
SIGTERM recorder is gone: a SIGTERM ends a task, or reaches `kdist.callbacks.BackupAndRestore(
save_before_preemption=True)`).

>>> from kdist.cluster import ClusterSpec
>>> spec = ClusterSpec.from_tf_config('{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},'
...                                   ' "task": {"type": "worker", "index": 1}}')
>>> [peer for peer, _ in peers_of(spec)]
['worker:0']
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time

from kdist import envvars, exit_codes, validators

logger = logging.getLogger("kdist")

DEFAULT_STARTUP_TIMEOUT = 600.0
FIRST_REPORT = 3.0  # seconds before the first line (a healthy start-up is over by then)
REPORT_EVERY = 30.0
POLL = 0.25
SAME_TASK = b"kdist: same task "  # what a second process given this task's index says to the first


class PeersMissing(SystemExit):
    """Other tasks did not start within the start-up deadline: the process exits with 69."""

    def __init__(self, message: str):
        super().__init__(exit_codes.PEERS_MISSING)
        self.message = message

    def __str__(self):
        return self.message


def startup_timeout(given: float | None = None) -> float:
    """Seconds a task waits for the others: `given`, else KDIST_STARTUP_TIMEOUT, else 600."""
    if given is not None:
        return validators.positive_number(given, "startup_timeout")
    from_env = validators.seconds_from_env(envvars.STARTUP_TIMEOUT)
    return DEFAULT_STARTUP_TIMEOUT if from_env is None else from_env


def peers_of(spec, roles=("chief", "worker", "ps")) -> list[tuple[str, str]]:
    """("type:index", address) of every task of `spec` in `roles` but this one."""
    return [(f"{t}:{i}", spec.address(t, i)) for t, i in spec.tasks()
            if t in roles and (t, i) != (spec.task_type, spec.task_index)]


def probe(address: str, timeout: float = 1.0) -> str | None:
    """None when something listens at `address`, else what connecting to it gave."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except socket.gaierror:
        return f"the name {host.strip('[]')} does not resolve"
    except socket.timeout:
        return "no answer: timed out"
    except OSError as error:
        return (os.strerror(error.errno) if error.errno else str(error)).lower()
    return None


def wait_for_peers(spec, timeout: float, roles=("chief", "worker", "ps"),
                   what: str = "the other tasks", hold_own_port: bool = True,
                   deadline_from: str = envvars.STARTUP_TIMEOUT) -> None:
    """Returns once every other task of `spec` in `roles` listens; see the module docstring.
    `deadline_from` names the setting `timeout` came from, for the messages."""
    peers = peers_of(spec, roles)
    if not peers:
        return
    own = hold_port(spec) if hold_own_port else None
    started, next_report = time.monotonic(), FIRST_REPORT
    try:
        while True:
            missing = [(peer, address, problem) for peer, address in peers
                       if (problem := probe(address)) is not None]
            if not missing:
                return
            if own is not None and (twin := _twin_knocked(own, spec.task)) is not None:
                raise _two_of(spec, f"another process ({twin}) started as {spec.task} on this host "
                              f"while this one waited for {_named(missing[0])}")
            waited = time.monotonic() - started
            if waited >= timeout:
                raise _missing(spec, missing, waited, what, deadline_from)
            if waited >= next_report:
                late = {peer for peer, _, _ in missing}
                up = [f"{spec.task} (this task)"] + [p for p, _ in peers if p not in late]
                logger.warning("kdist: %s has waited %.0f s for %s: waiting for %s; started: %s "
                               "(deadline %g s, %s)", spec.task, waited, what,
                               "; ".join(_named(m) for m in missing), ", ".join(up), timeout,
                               deadline_from)
                next_report += REPORT_EVERY
            time.sleep(POLL)
    finally:
        if own is not None:
            own.close()


def _named(missing) -> str:
    peer, address, problem = missing
    return f"{peer} at {address} ({problem})"


def _missing(spec, missing, waited: float, what: str, deadline_from: str) -> PeersMissing:
    message = (f"kdist: error: {spec.task} gave up after {waited:.0f} s waiting for {what}: "
               f"{'; '.join(_named(m) for m in missing)}. Fix: start every task TF_CONFIG names, "
               "with the same cluster, reachable at its address (a firewall or a wrong host "
               f"shows as no route or a timeout); to wait longer set {deadline_from} (seconds)"
               + (" or kdist.strategy(startup_timeout=...)"
                  if deadline_from == envvars.STARTUP_TIMEOUT else ""))
    print(message, file=sys.stderr, flush=True)
    return PeersMissing(message)


def hold_port(spec) -> socket.socket:
    """Listens on this task's port (until TensorFlow's server takes it over); a port that is
    taken raises `UsageError` naming the task, the port and the fix."""
    port = int(spec.address(spec.task_type, spec.task_index).rpartition(":")[2])
    own = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if own.family == socket.AF_INET6:
        own.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        own.bind(("", port))
    except OSError as error:
        own.close()
        taken = f"port {port} of task {spec.task} is taken on this host ({os.strerror(error.errno)})"
        if _tell_holder(port, spec.task):
            raise _two_of(spec, f"{taken}, by a process that started as {spec.task} too") from None
        raise validators.UsageError(
            f"{spec.source}.cluster.{spec.task_type}[{spec.task_index}]", taken,
            "stop what holds it (ss -ltnp), or give this task another port") from None
    own.listen(16)
    own.setblocking(False)  # the wait reads who knocks without waiting for anyone
    return own


def _two_of(spec, problem: str) -> validators.UsageError:
    return validators.UsageError(
        f"{spec.source}.task", f"{problem}: two tasks were given the index {spec.task_index}",
        f"give each task its own index (task.index 0 to {len(spec.jobs[spec.task_type]) - 1} "
        f"for {spec.task_type})")


def _tell_holder(port: int, task: str) -> bool:
    """Tells a kdist task waiting for its peers on `port` that this process was given its index
    (`task`) too; whether it was one (it answers in kind)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as holder:
            holder.sendall(SAME_TASK + task.encode() + f" (pid {os.getpid()})\n".encode())
            return holder.recv(len(SAME_TASK)) == SAME_TASK
    except OSError:
        return False


def _twin_knocked(own: socket.socket, task: str) -> str | None:
    """Who said it was given this task's index too, of the connections `own` holds (peers
    probing it send nothing and close); None if nobody did."""
    while True:
        try:
            knock, _ = own.accept()
        except OSError:  # nobody waiting (BlockingIOError)
            return None
        with knock:
            knock.settimeout(POLL)
            try:
                said = knock.recv(256)
                if said.startswith(SAME_TASK):
                    knock.sendall(SAME_TASK + task.encode() + b"\n")
                    return said[len(SAME_TASK):].decode(errors="replace").strip()
            except OSError:
                continue


@contextlib.contextmanager
def signals_kept():
    """The block runs TensorFlow's start-up; afterwards the program's SIGTERM and SIGINT handlers
    are back (TensorFlow replaced SIGTERM's with a recorder). Main thread only, as signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
