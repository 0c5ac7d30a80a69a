"""`kdist launch --private-network`: the local job in a network namespace of its own.

TensorFlow's gRPC server listens on every interface of the host whatever address TF_CONFIG gives
it, and it has no authentication. `kdist launch` gives every task a 127.0.0.1 address; with
``--private-network`` the launcher first moves itself into a new network namespace (``unshare``)
that holds only a loopback interface, so its tasks can reach each other and nothing else can reach
them. The price: the tasks have no outside network (download datasets first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from kdist.validators import UsageError

MARKER = "KDIST_PRIVATE_NETWORK"


def enter_private_network() -> None:
    """Re-executes this `kdist` command inside a new network namespace; returns once inside."""
    if os.environ.get(MARKER) == "1":
        _loopback_up()
        return
    unshare = shutil.which("unshare")
    if unshare is None:
        raise UsageError("--private-network", "unshare is not on PATH", "install util-linux")
    flags = ["--net"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--net"]
    os.environ[MARKER] = "1"
    sys.stdout.flush()
    os.execv(unshare, [unshare, *flags, "--", sys.executable, "-m", "kdist", *sys.argv[1:]])


def _loopback_up() -> None:
    result = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if result.returncode:
        raise UsageError("--private-network", "cannot bring up the loopback interface "
                         f"({result.stderr.strip() or 'ip not found'})", "install iproute2")
