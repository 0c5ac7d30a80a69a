"""The cluster of a Slurm job step, so that `srun python train.py` needs no TF_CONFIG.

Inside a step of several tasks (``srun --ntasks=N``, Slurm sets ``SLURM_STEP_NUM_TASKS`` > 1),
`kdist.cluster()` computes the cluster from the step's environment:

- the nodes, in order, from ``SLURM_STEP_NODELIST`` (``node[07-08]``), and how many tasks each
  runs from ``SLURM_STEP_TASKS_PER_NODE`` (``2(x2)``); ranks fill the nodes in order under
  Slurm's default block distribution, round-robin under cyclic (other distributions are refused,
  naming the flag);
- each node's address: its ``NodeAddr`` from ``scontrol show node`` where scontrol is installed
  (several nodes may share a host, as on a test cluster or a node split into several slurmd), else
  its name;
- the ports, by the rule: task i listens on ``KDIST_SLURM_PORT`` (8888) plus its slot *on its
  address*: the number of tasks before it in rank order with the same address. Two tasks on one
  host, whether on one node or on two nodes that share the host, never get the same port;
- the roles: every task a worker (MultiWorkerMirrored) unless ``KDIST_SLURM_ROLES=chief=1,worker=2,
  ps=1``, which assigns ranks to roles in TensorFlow's order (chief, evaluator, ps, worker).

On nodes with GPUs, when a node's visible GPUs split evenly over its tasks, each task gets its
share through ``CUDA_VISIBLE_DEVICES``; on CPU-only nodes nothing is changed. A TF_CONFIG in the
environment always wins, and a single-task step (or a batch script outside srun) is a single
process.

Example, on two nodes with ``srun --nodes=2 --ntasks-per-node=2 python train.py``: Slurm sets
``SLURM_STEP_NODELIST=node[07-08]``, ``SLURM_STEP_TASKS_PER_NODE=2(x2)``, and for the second task
``SLURM_PROCID=1``, so `kdist.cluster()` is::

    ClusterSpec(worker=4, task=worker:1)  # worker: node07:8888, node07:8889, node08:8888, node08:8889

>>> expand_hostlist("node[07-08],gpu[1,3-4]")
['node07', 'node08', 'gpu1', 'gpu3', 'gpu4']
>>> tasks_per_node("2(x2),1")
[2, 2, 1]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Mapping

from kdist import envvars, global_state, validators
from kdist.cluster.spec import JOBS, ClusterSpec, ClusterSpecError

DEFAULT_PORT = 8888
_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
                   "SLURM_STEP_TASKS_PER_NODE")
# Everything `cluster_from_slurm` reads: what `kdist.cluster()` memoizes on.
VARIABLES = (*_STEP_VARIABLES, envvars.SLURM_PORT, envvars.SLURM_ROLES, "SLURM_DISTRIBUTION",
             "CUDA_VISIBLE_DEVICES")
_ROLE_ORDER = ("chief", "evaluator", "ps", "worker")  # TensorFlow's order of ranks to roles


def in_slurm_step(environ: Mapping[str, str] | None = None) -> bool:
    """True inside an srun step of more than one task."""
    environ = os.environ if environ is None else environ
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    return "SLURM_PROCID" in environ and validators.is_digits(tasks) and int(tasks) > 1


def cluster_from_slurm() -> ClusterSpec:
    """The ClusterSpec (with this task) of the current Slurm step."""
    missing = [name for name in _STEP_VARIABLES if not os.environ.get(name)]
    if missing:
        raise ClusterSpecError(missing[0], "not set: Slurm sets it inside a job step",
                               "start the tasks with srun, or set TF_CONFIG yourself")
    distribution = os.environ.get("SLURM_DISTRIBUTION", "block").split(":")[0]
    if distribution not in ("block", "cyclic"):
        raise ClusterSpecError("SLURM_DISTRIBUTION", f"{distribution!r}: kdist knows which node "
                               "runs each rank under the block and cyclic distributions",
                               "run srun with --distribution=block (the default) or cyclic")
    num_tasks, rank = _count("SLURM_STEP_NUM_TASKS"), _count("SLURM_PROCID")
    nodes = expand_hostlist(os.environ["SLURM_STEP_NODELIST"])
    counts = tasks_per_node(os.environ["SLURM_STEP_TASKS_PER_NODE"])
    if len(counts) != len(nodes) or sum(counts) != num_tasks or rank >= num_tasks:
        raise ClusterSpecError("SLURM_STEP_TASKS_PER_NODE", f"{counts} tasks on the nodes {nodes} "
                               f"do not make the step's {num_tasks} tasks (this one is rank "
                               f"{rank})", "run kdist inside the srun step whose variables these "
                               "are")
    task_nodes = _nodes_of_ranks(nodes, counts, distribution)
    addresses = _addresses(task_nodes, _port(os.environ.get(envvars.SLURM_PORT)))
    roles = parse_roles(os.environ.get(envvars.SLURM_ROLES), num_tasks)
    jobs, task = {}, None
    for position, address in enumerate(addresses):
        job = _role_of(position, roles)
        jobs.setdefault(job, []).append(address)
        if position == rank:
            task = (job, len(jobs[job]) - 1)
    _share_gpus(task_nodes, rank)
    return ClusterSpec({job: jobs[job] for job in JOBS if job in jobs}, *task, source="Slurm")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``a[1-3,7],b05``) as names."""
    names = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", text):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not match:
            names.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not validators.is_digits(low) or (high and not validators.is_digits(high)):
                raise ClusterSpecError("SLURM_STEP_NODELIST", f"{text!r} is not a Slurm host list",
                                       "run kdist inside an srun step")
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{str(number).zfill(len(low))}{suffix}")
    if not names:
        raise ClusterSpecError("SLURM_STEP_NODELIST", f"{text!r} names no node",
                               "run kdist inside an srun step")
    return names


def tasks_per_node(text: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``) as one count per node."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", item)
        if not match:
            raise ClusterSpecError("SLURM_STEP_TASKS_PER_NODE", f"{text!r} is not Slurm's "
                                   "tasks-per-node list", "run kdist inside an srun step")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def parse_roles(text: str | None, num_tasks: int) -> dict[str, int]:
    """``"chief=1,worker=3"`` -> {"chief": 1, "worker": 3}, checked against the step's task count."""
    if not text:
        return {"worker": num_tasks}
    roles: dict[str, int] = {}
    for part in text.split(","):
        job, sep, count = part.strip().partition("=")
        if not sep or not validators.is_digits(count.strip()):
            raise ClusterSpecError(envvars.SLURM_ROLES, f"{part.strip()!r} is not ROLE=COUNT",
                                   "write e.g. KDIST_SLURM_ROLES=chief=1,worker=3")
        if job.strip() not in JOBS:
            raise ClusterSpecError(f"{envvars.SLURM_ROLES}.{job.strip()}", "unknown job",
                                   f"use one of {', '.join(JOBS)}")
        roles[job.strip()] = int(count)
    if sum(roles.values()) != num_tasks:
        raise ClusterSpecError(envvars.SLURM_ROLES,
                               f"{sum(roles.values())} tasks for a step of {num_tasks}",
                               f"make the counts add up to SLURM_STEP_NUM_TASKS={num_tasks}")
    return {job: n for job, n in roles.items() if n}


def _nodes_of_ranks(nodes: list[str], counts: list[int], distribution: str) -> list[str]:
    """The node of each rank: block fills each node in turn, cyclic deals the ranks round-robin
    over the nodes that still have tasks.

    >>> _nodes_of_ranks(["a", "b"], [2, 1], "block"), _nodes_of_ranks(["a", "b"], [2, 1], "cyclic")
    (['a', 'a', 'b'], ['a', 'b', 'a'])
    """
    if distribution == "block":
        return [node for node, count in zip(nodes, counts) for _ in range(count)]
    left, ranks = list(counts), []
    while any(left):
        for position, node in enumerate(nodes):
            if left[position]:
                ranks.append(node)
                left[position] -= 1
    return ranks


def _role_of(position: int, roles: dict[str, int]) -> str:
    for job in _ROLE_ORDER:
        if position < roles.get(job, 0):
            return job
        position -= roles.get(job, 0)
    raise AssertionError("parse_roles checked the counts")


def _addresses(task_nodes: list[str], base_port: int) -> list[str]:
    """``host:port`` of each task, the port its slot on its host (the rule in the docstring)."""
    slots: dict[str, int] = {}
    addresses = []
    for host in map(_node_address, task_nodes):
        port = base_port + slots.get(host, 0)
        slots[host] = slots.get(host, 0) + 1
        if port > 65535:
            raise ClusterSpecError(envvars.SLURM_PORT, f"{base_port} plus the {slots[host]} "
                                   f"tasks on {host} passes port 65535",
                                   f"set {envvars.SLURM_PORT} to at most {65536 - slots[host]}")
        addresses.append(f"{host}:{port}")
    return addresses


def _node_address(node: str) -> str:
    """A node's NodeAddr from scontrol (several nodes may share a host), else its name."""
    addresses = global_state.process().slurm_node_addresses
    if node not in addresses:
        address = node
        if shutil.which("scontrol"):
            try:
                shown = subprocess.run(["scontrol", "show", "node", node, "-o"],
                                       capture_output=True, text=True, timeout=30).stdout
                address = re.search(r"\bNodeAddr=(\S+)", shown).group(1)
            except (OSError, subprocess.SubprocessError, AttributeError):
                address = node
        addresses[node] = address
    return addresses[node]


def _port(text: str | None) -> int:
    if text is None:
        return DEFAULT_PORT
    if not validators.is_digits(text) or not validators.port(int(text)):
        raise ClusterSpecError(envvars.SLURM_PORT, f"bad port {text!r}",
                               "use a port number from 1 to 65535")
    return int(text)


def _count(name: str) -> int:
    text = os.environ[name]
    if not validators.is_digits(text):
        raise ClusterSpecError(name, f"{text!r} is not a count", "run kdist inside an srun step")
    return int(text)


def _share_gpus(task_nodes: list[str], rank: int) -> None:
    """This task's share of its node's visible GPUs, when they split evenly over its tasks."""
    shared = os.environ.get(envvars.SLURM_NODE_GPUS)  # the node's, before a first share
    gpus = shared.split(",") if shared else _visible_gpus()
    node = task_nodes[rank]
    on_node = task_nodes.count(node)
    if not gpus or on_node < 2 or len(gpus) % on_node:
        return
    local = rank - task_nodes.index(node)
    share = len(gpus) // on_node
    os.environ[envvars.SLURM_NODE_GPUS] = ",".join(gpus)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[local * share:(local + 1) * share])


def _visible_gpus() -> list[str]:
    """The GPUs this task sees: CUDA_VISIBLE_DEVICES, else nvidia-smi's (none without it)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True,
                                timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU ")]
