"""Compression where it saves little: every replica on one host.

Between replicas of one host the gradients cross memory or the loopback, never a network, so a
compressor's CPU time (compressing, summing its payload, decompressing) is hardly bought back by
the bytes it saves: on 2 loopback workers the step took 0.91x (BF16) to 2.64x (TopK 1%) the
uncompressed one (benchmarks/results/peers_compression.md). The scope says so, once per scope,
with the command that weighs it for the user's own link; it changes nothing.

>>> where_replicas_are(["127.0.0.1:2222", "localhost:2223"])
'127.0.0.1'
>>> where_replicas_are(["node-a:2222", "node-b:2222"]) is None
True
"""

from __future__ import annotations

import logging

from kdist.cluster.addresses import host_of, is_loopback

logger = logging.getLogger("kdist")


def where_replicas_are(addresses: list[str]) -> str | None:
    """The one host of `addresses` ("host:port"; loopback names count as one), else None."""
    if all(is_loopback(address) for address in addresses):
        return "127.0.0.1"
    hosts = {host_of(address) for address in addresses}
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
        "memory, not a network, where compression saves little and often costs more CPU than "
        "it saves (2 loopback workers, 784-1024-1024-10 MLP: the step 0.91x with BF16, 1.06x "
        "PowerSGD, 1.39x FP16, 2.64x TopK, of the uncompressed one). `kdist plan --compression "
        "NAME --bandwidth LINK ...` weighs it for your link", name, host)
