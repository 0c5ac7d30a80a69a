"""Emulated multi-host networks on one Linux machine, for tests and benchmarks (root + iproute2).

`Network(hosts)` gives every host name its own network namespace with its own address on a private
bridge, and an ``/etc/hosts`` that resolves every host name of the network (``ip netns exec``
bind-mounts ``/etc/netns/<namespace>/hosts`` over ``/etc/hosts``). With `rate`, each host's link is
shaped by a token bucket (``tc qdisc tbf``), so every byte a host sends crosses a link of that
speed. Nothing outside the namespaces it creates is touched, and they are deleted on exit.

    with Network(["worker-0.demo", "worker-1.demo"], rate="100mbit") as network:
        subprocess.run(network.exec_prefix("worker-0.demo") + ["getent", "hosts", "worker-1.demo"])
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Sequence

NETNS_CONFIG = "/etc/netns"
SUBNET = "10.213"  # /16 private addresses, only ever assigned inside kdist's own namespaces
_RATE_UNITS = {"kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9}


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or in a privileged container)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed: apt-get install iproute2"
    return None


def namespaces() -> list[str]:
    """Every namespace a Network made and has not deleted yet (named ``kd<pid>...``)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in listed.splitlines() if line.strip()]
    return [name for name in names if re.fullmatch(r"kd\d+(sw|h\d+)", name)]


def remove_stale() -> list[str]:
    """Deletes the namespaces left by a process that no longer runs (a run killed before its
    Network could close) and returns their names; a live process's namespaces are kept."""
    stale = [name for name in namespaces() if not _alive(creator(name))]
    for name in stale:
        _delete(name)
    return stale


def creator(namespace: str) -> int:
    """The pid of the process whose Network made `namespace` (a name of `namespaces()`)."""
    return int(re.match(r"kd(\d+)", namespace)[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete(namespace: str) -> None:
    """Kills what runs in `namespace`, then deletes it and its /etc/netns folder."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                          text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
    shutil.rmtree(os.path.join(NETNS_CONFIG, namespace), ignore_errors=True)


def rate_bits(rate: str) -> float:
    """``"100mbit"`` -> 1e8 bits per second (tc's units: kbit, mbit, gbit)."""
    number, unit = rate[:-4], rate[-4:].lower()
    try:
        return float(number) * _RATE_UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"rate={rate!r}: write a number followed by kbit, mbit or gbit, "
                         "e.g. 100mbit") from None


class Network:
    """Hosts in their own network namespaces on one bridge, resolving each other by name.

    Args:
        hosts: host names (e.g. Kubernetes pod DNS names); each gets a namespace and an address.
        rate: optional link speed of every host (tc units, e.g. ``"1gbit"``).
        mtu: the links' MTU (1500, Ethernet's; 9000 for jumbo frames as in many data centres).
    """

    def __init__(self, hosts: Sequence[str], rate: str | None = None, mtu: int = 1500):
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"hosts={list(hosts)!r}: give distinct host names")
        if len(hosts) > 250:
            raise ValueError(f"{len(hosts)} hosts: at most 250 per network")
        if rate is not None:
            rate_bits(rate)
        if not 68 <= mtu <= 65535:
            raise ValueError(f"mtu={mtu}: use 68 to 65535")
        self.hosts, self.rate, self.mtu = list(hosts), rate, mtu
        prefix = f"kd{os.getpid()}"
        self.switch = f"{prefix}sw"
        self.namespaces = {host: f"{prefix}h{i}" for i, host in enumerate(self.hosts)}
        self.addresses = {host: f"{SUBNET}.0.{i + 1}" for i, host in enumerate(self.hosts)}
        self._made: list[str] = []

    def __enter__(self) -> "Network":
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"cannot emulate a network: {reason}")
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def exec_prefix(self, host: str) -> list[str]:
        """argv prefix that runs a command on `host`."""
        return ["ip", "netns", "exec", self.namespaces[host]]

    def run_workers(self, command: list[str], port: int, timeout: float) -> None:
        """Runs `command` on every host as worker i of one cluster (TF_CONFIG: host i:`port`) and
        waits; raises RuntimeError with the output's tail if a worker fails."""
        cluster = {"worker": [f"{host}:{port}" for host in self.hosts]}
        tasks = [subprocess.Popen(
            self.exec_prefix(host) + command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": i}})))
            for i, host in enumerate(self.hosts)]
        try:
            for host, task in zip(self.hosts, tasks):
                _, err = task.communicate(timeout=timeout)
                if task.returncode:
                    raise RuntimeError(f"the worker on {host} exited with {task.returncode}: "
                                       f"{err[-2000:]}")
        finally:
            for task in tasks:
                task.kill()
                task.wait()

    def cut(self, host: str) -> None:
        """From now on every packet to and from `host` is lost, silently, as behind a failed
        switch port: its link leaves the switch, and its sockets stay open."""
        _ip("-n", self.switch, "link", "set", f"p{self.hosts.index(host)}", "nomaster")

    def close(self) -> None:
        """Deletes every namespace this network made (killing what still runs in them)."""
        for namespace in reversed(self._made):
            _delete(namespace)
        self._made.clear()

    # ------------------------------------------------------------------ set-up
    def _make(self) -> None:
        self._namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{self.addresses[h]} {h}\n" for h in self.hosts)
        for i, host in enumerate(self.hosts):
            namespace = self.namespaces[host]
            self._namespace(namespace)
            _ip("-n", self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
                "netns", namespace)
            _ip("-n", self.switch, "link", "set", f"p{i}", "mtu", str(self.mtu))
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", namespace, "addr", "add", f"{self.addresses[host]}/16", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "mtu", str(self.mtu), "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            os.makedirs(os.path.join(NETNS_CONFIG, namespace), exist_ok=True)
            with open(os.path.join(NETNS_CONFIG, namespace, "hosts"), "w") as f:
                f.write(hosts_file)
            if self.rate:
                burst = max(32_000, int(rate_bits(self.rate) / 8 / 100))  # 10 ms worth of bytes
                _run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "eth0", "root",
                      "tbf", "rate", self.rate, "burst", str(burst), "latency", "50ms"])

    def _namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")
