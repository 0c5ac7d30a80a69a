"""A local launch's private network: a network namespace that holds only a loopback interface.

TensorFlow's gRPC server listens on every interface of the host whatever address TF_CONFIG gives
it, and it runs any op it is sent, unauthenticated: anyone who can reach a laptop or a shared
workstation could read and write its files through a task's port. So by default `kdist launch`
runs its tasks in a network namespace of their own (``--network private``): they reach each other
on 127.0.0.1 and nothing else reaches them; the price is that they have no outside network either
(download datasets first, or ``--network host``).

`PrivateNetwork` starts a small holder process in a new namespace (``unshare --net``; without root,
``unshare --user --map-root-user --net``, unprivileged user namespaces), which brings the loopback
interface up and lives until the launcher closes it (or dies); each task then enters the namespace
through `exec_prefix` (``nsenter``), which execs the task's own command: same process, same
signals. Restarted tasks enter the same namespace, so their addresses stay valid.

>>> import subprocess
>>> with PrivateNetwork() as network:  # doctest: +SKIP
...     subprocess.run(network.exec_prefix() + ["cat", "/proc/net/dev"])
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


READY = "ready"
# The holder: brings lo up (ioctl SIOCGIFFLAGS/SIOCSIFFLAGS, no iproute2 needed), says so, and
# waits for its stdin to close: the launcher's end, or its death.
_HOLDER = """\
import fcntl, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))
print("%s", flush=True)
sys.stdin.read()
""" % READY


# What a program prints when it has no network: resolver and socket errors (glibc, Python, gRPC)
OFFLINE_SIGNS = ("Temporary failure in name resolution", "Name or service not known",
                 "No address associated with hostname", "Network is unreachable",
                 "getaddrinfo failed", "DNS resolution failed")
OFFLINE_HINT = ("the tasks ran on kdist launch's private network, which has no outside access: "
                "download what they need before the launch, or launch with network=\"host\" "
                "(kdist launch --network host)")


def offline_hint(texts: list[str]) -> str | None:
    """`OFFLINE_HINT` when a failed task's text (its exception, its last lines) shows it tried
    to reach the outside network."""
    return OFFLINE_HINT if any(sign in text for text in texts for sign in OFFLINE_SIGNS) else None


class Unavailable(RuntimeError):
    """A private network cannot be made here; the message says why."""


def unavailable_reason() -> str | None:
    """Why this machine cannot give a launch a private network, or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's ({sys.platform} has none)"
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not on PATH (install util-linux)"
    return None


class PrivateNetwork:
    """A network namespace with only a loopback interface, for the tasks of one launch."""

    def __init__(self, timeout: float = 10.0, rootless: bool | None = None):
        self.timeout = timeout
        self.rootless = os.geteuid() != 0 if rootless is None else rootless  # a user namespace
        self._holder: subprocess.Popen | None = None

    def __enter__(self) -> "PrivateNetwork":
        reason = unavailable_reason()
        if reason:
            raise Unavailable(reason)
        flags = ["--user", "--map-root-user", "--net"] if self.rootless else ["--net"]
        self._holder = subprocess.Popen(
            ["unshare", *flags, "--", sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = self._holder.stdout.readline().strip()
        if line != READY:
            self._holder.kill()
            _, err = self._holder.communicate(timeout=self.timeout)
            why = (err.strip().splitlines() or [f"exit code {self._holder.returncode}"])[-1]
            raise Unavailable(f"unshare {' '.join(flags)} failed: {why}" +
                              ("; unprivileged user namespaces may be off (sysctl "
                               "user.max_user_namespaces, or the container's seccomp profile)"
                               if self.rootless else ""))
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int:
        return self._holder.pid

    def exec_prefix(self) -> list[str]:
        """argv prefix that runs a command in the namespace (nsenter execs it: same pid)."""
        entered = ["--user", "--preserve-credentials", "--net"] if self.rootless else ["--net"]
        return ["nsenter", f"--target={self.pid}", *entered, "--"]

    def close(self) -> None:
        """Ends the holder; the namespace goes with the last task still in it."""
        if self._holder is None:
            return
        holder, self._holder = self._holder, None
        try:
            holder.stdin.close()
            holder.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()


def exposure_warning(addresses: list[str], why: str) -> str:
    """The warning of a launch whose tasks other hosts can reach."""
    return (f"WARNING: the tasks' TensorFlow ports ({', '.join(addresses)}) are reachable from "
            "other hosts: TensorFlow listens on every interface and runs any op it is sent, "
            f"unauthenticated. No private network here: {why}. Run where network namespaces are "
            "allowed, firewall these ports, or launch with network=\"host\" (kdist launch "
            "--network host) to accept this and silence the warning.")


def multi_host_warning(addresses: list[str]) -> str:
    """The warning of a multi-host launch, whose tasks must be reachable by the other machines."""
    return (f"WARNING: the tasks' TensorFlow ports ({', '.join(addresses)}) listen on this "
            "machine's network, where every host that reaches them can run any op, "
            "unauthenticated. Keep the machines on a private network, or firewall these ports to "
            "the cluster's hosts; launch with network=\"host\" (kdist launch --network host) to "
            "accept this and silence the warning. "
            "Set KDIST_JOB_SECRET to one value on every machine: kdist's TCP ring then admits only "
            "tasks that know it (unset, the first worker draws one and shares it through "
            "TensorFlow's coordination service, which those ports expose).")
