"""Compression where it cannot pay: every replica on one host.

Between replicas of one host the gradients cross memory or the loopback, never a network, so a
compressor's CPU time (compressing, summing its payload, decompressing) is not bought back by
bytes saved: on 2 loopback workers FP16 made the step 1.36x the uncompressed one
(benchmarks/results/peers_compression.md). The scope says so, once per scope, with the command
that measures it on the user's own link; it changes nothing.

>>> where_replicas_are(["127.0.0.1:2222", "localhost:2223"])
'127.0.0.1'
>>> where_replicas_are(["node-a:2222", "node-b:2222"]) is None
True
"""

from __future__ import annotations

import logging

logger = logging.getLogger("kdist")

_LOOPBACK = ("localhost", "::1", "[::1]")


def where_replicas_are(addresses: list[str]) -> str | None:
    """The one host of `addresses` ("host:port"; loopback names count as one), else None."""
    hosts = {address.rpartition(":")[0] for address in addresses}
    if all(host in _LOOPBACK or host.startswith("127.") for host in hosts):
        return "127.0.0.1"
    return hosts.pop() if len(hosts) == 1 else None


def warn_if_one_host(compressor, strategy, cluster) -> None:
    """Logs a warning when `compressor` compresses between replicas of one host: `strategy`'s
    replicas on this process alone (`cluster` None or a single task), or every task of `cluster`
    (a `kdist.cluster.ClusterSpec`) on one host."""
    if compressor is None or strategy.num_replicas_in_sync < 2:
        return
    tasks = cluster.tasks() if cluster is not None and cluster.is_distributed else []
    host = "this process" if len(tasks) < 2 else \
        where_replicas_are([cluster.address(*task) for task in tasks])
    if host is None:
        return
    name = type(compressor).__name__
    logger.warning(
        "kdist: compression %s with every replica on one host (%s): the gradients cross its "
        "memory, not a network, so compressing them costs more CPU than the bytes it saves "
        "(FP16 on 2 loopback workers: 1.36x the uncompressed step). Drop it here; for your real "
        "link, `kdist plan --compression NAME --bandwidth LINK ...` measures both", name, host)
