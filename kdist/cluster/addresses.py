"""A task's address, read: its host, and whether it is this machine's loopback.

>>> host_of("[::1]:2222"), is_loopback("localhost:2223")
('::1', True)
"""

from __future__ import annotations

LOOPBACK_PREFIXES = ("127.", "localhost", "[::1]")


def host_of(address: str) -> str:
    """``"10.0.0.1:2222"`` -> ``"10.0.0.1"``; ``"[::1]:2222"`` -> ``"::1"``."""
    return address.rsplit(":", 1)[0].strip("[]")


def is_loopback(address: str) -> bool:
    return address.startswith(LOOPBACK_PREFIXES)


def all_loopback(spec) -> bool:
    """True when every task of `spec` (a `ClusterSpec`) listens on this machine's loopback (a
    local cluster)."""
    return all(is_loopback(spec.address(*task)) for task in spec.tasks())
