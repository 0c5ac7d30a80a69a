"""Which tasks of a cluster run on this machine: the launcher's answer for multi-host specs.

A spec with fixed addresses on several machines (the TF multi-worker tutorial's case, torchrun's
``--nnodes``/``--node-rank``) is launched once per machine with the same file: each launcher starts
the tasks whose host is one of this machine's addresses (a host name is resolved; an address is
this machine's when a socket can bind to it), or those of the host named by ``--host``.

>>> from kdist.cluster import ClusterSpec
>>> spec = ClusterSpec({"worker": ["127.0.0.1:2222", "192.0.2.7:2222"]})
>>> tasks_here(spec)
[('worker', 0)]
>>> tasks_here(spec, host="192.0.2.7")
[('worker', 1)]
"""

from __future__ import annotations

import socket

from kdist.cluster.addresses import host_of, is_loopback
from kdist.cluster.spec import ClusterSpec
from kdist.validators import UsageError


def is_this_machine(host: str) -> bool:
    """True when `host` (a name or an address) resolves to an address this machine can bind."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    for family, kind, _, _, address in infos:
        try:
            with socket.socket(family, kind) as probe:
                probe.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def tasks_here(spec: ClusterSpec, host: str | None = None) -> list[tuple[str, int]]:
    """The tasks of `spec` to start on this machine: those on `host` when given, else those whose
    host is one of this machine's addresses. A `UsageError` names the hosts when there are none."""
    tasks = spec.tasks()
    if host is not None:
        here = [t for t in tasks if host_of(spec.address(*t)) == host_of(host)]
        what = f"no task of the cluster is on host {host!r}"
    else:
        local = {}
        for task in tasks:
            name = host_of(spec.address(*task))
            if name not in local:
                local[name] = is_loopback(spec.address(*task)) or is_this_machine(name)
        here = [t for t in tasks if local[host_of(spec.address(*t))]]
        what = "none of the cluster's hosts is an address of this machine"
    if not here:
        hosts = sorted({host_of(spec.address(*t)) for t in tasks})
        raise UsageError("--host", f"{what} (hosts: {', '.join(hosts)})",
                         "run kdist launch on each of those machines with the same spec, or pass "
                         "--host with this machine's name in the spec")
    return here
