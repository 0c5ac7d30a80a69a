"""A lost peer named on a failure's first line: TensorFlow's coordination service reports a task
that stopped sending heartbeats on the line under its error, as `/job:worker/replica:0/task:1`,
and a task that lost the service itself only by the heartbeat's RPC. kdist's failure record
(`kdist.failure`) and so the launch summary's headline say instead which task, at which
address, and what to check.

>>> spec = ClusterSpec({"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "worker", 0)
>>> print(explain("Collective ops is aborted by: Error reported from /job:worker/task:1: The "
...               "following tasks are unhealthy (stopped sending heartbeats):\\n"
...               "/job:worker/replica:0/task:1\\nThe tasks have crashed.", spec))
worker:1 (10.0.0.2:2222) stopped sending heartbeats to TensorFlow's coordination service: it \
crashed, froze or lost its network; see its log, and its host's network
>>> print(explain("Collective ops is aborted by: Deadline Exceeded\\nRPC: "
...               "/tensorflow.CoordinationService/Heartbeat", spec.with_task("worker", 1)))
worker:0 (10.0.0.1:2222), which runs TensorFlow's coordination service, stopped answering this \
task's heartbeats: it crashed, froze or this host lost its network to it; see its log, and the \
network between the hosts
>>> explain("Graph execution error: shapes differ", spec) is None
True
"""

from __future__ import annotations

import re

from kdist.cluster.spec import ClusterSpec

_TASK = r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)"
# TF 2.17-2.22 list the tasks after "(stopped sending heartbeats):"; each one's own error says
# "Task /job:worker/replica:0/task:1 heartbeat timeout."
_UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):((?:\s*" + _TASK
                        + r")+)")
_TIMED_OUT = re.compile(r"Task " + _TASK + r" heartbeat timeout")
_HEARTBEAT_RPC = re.compile(r"RPC: /[\w.]*CoordinationService/Heartbeat")


def explain(message: str, spec: ClusterSpec) -> str | None:
    """What happened, naming the lost task, or None when `message` reports no lost peer."""
    lost = _unhealthy(message)
    if lost:
        names = ", ".join(_named(spec, job, index) for job, index in lost)
        verb = "stopped" if len(lost) == 1 else "each stopped"
        return (f"{names} {verb} sending heartbeats to TensorFlow's coordination service: "
                f"{'it' if len(lost) == 1 else 'each'} crashed, froze or lost its network; see "
                f"{'its log' if len(lost) == 1 else 'their logs'}, and its host's network")
    if _HEARTBEAT_RPC.search(message) and spec.leader and spec.task and \
            (spec.task_type, spec.task_index) != spec.leader:
        return (f"{_named(spec, *spec.leader)}, which runs TensorFlow's coordination service, "
                "stopped answering this task's heartbeats: it crashed, froze or this host lost "
                "its network to it; see its log, and the network between the hosts")
    return None


def _unhealthy(message: str) -> list[tuple[str, int]]:
    """The tasks the coordination service reports as stopped, in its order, once each."""
    found = _UNHEALTHY.search(message)
    tasks = re.findall(_TASK, found.group(1)) if found else _TIMED_OUT.findall(message)
    return list(dict.fromkeys((job, int(index)) for job, index in tasks))


def _named(spec: ClusterSpec, job: str, index: int) -> str:
    """`worker:1 (10.0.0.2:2222)`, without the address where the spec has no such task."""
    try:
        return f"{job}:{index} ({spec.address(job, index)})"
    except (KeyError, IndexError):
        return f"{job}:{index}"
