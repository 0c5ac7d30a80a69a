"""The cluster of a Slurm job step, so that `srun python train.py` needs no TF_CONFIG.

Inside a step of several tasks (``srun --ntasks=N``, Slurm sets ``SLURM_STEP_NUM_TASKS`` > 1),
`kdist.cluster()` asks TensorFlow's own `SlurmClusterResolver` for the cluster: task i of the step
(``SLURM_PROCID``) runs on its node at port ``KDIST_SLURM_PORT + (its slot on that node)``. By default
every task is a worker (MultiWorkerMirrored); ``KDIST_SLURM_ROLES=chief=1,worker=2,ps=1`` assigns
ranks to roles in TF's order (chief, evaluator, ps, worker). A TF_CONFIG in the environment always
wins, and a single-task step (or a batch script outside srun) is a single process.

On nodes with GPUs, TF's resolver also gives each task its own share of them through
``CUDA_VISIBLE_DEVICES``; on CPU-only nodes nothing is changed.

Example, on two nodes with ``srun --nodes=2 --ntasks-per-node=2 python train.py``: Slurm sets
``SLURM_STEP_NODELIST=node[07-08]``, ``SLURM_STEP_TASKS_PER_NODE=2(x2)``, and for the second task
``SLURM_PROCID=1``, so `kdist.cluster()` is::

    ClusterSpec(worker=4, task=worker:1)  # worker: node07:8888, node07:8889, node08:8888, node08:8889
"""

from __future__ import annotations

import os
import shutil
from typing import Mapping

from kdist import validators
from kdist.cluster.spec import JOBS, ClusterSpec, ClusterSpecError

PORT_ENV = "KDIST_SLURM_PORT"
ROLES_ENV = "KDIST_SLURM_ROLES"
DEFAULT_PORT = 8888  # TF's SlurmClusterResolver port_base
_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
                   "SLURM_STEP_TASKS_PER_NODE")
# Everything `cluster_from_slurm` reads: what `kdist.cluster()` memoizes on.
VARIABLES = (*_STEP_VARIABLES, PORT_ENV, ROLES_ENV, "CUDA_VISIBLE_DEVICES")


def in_slurm_step(environ: Mapping[str, str] | None = None) -> bool:
    """True inside an srun step of more than one task."""
    environ = os.environ if environ is None else environ
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    return "SLURM_PROCID" in environ and tasks.isdigit() and int(tasks) > 1


def cluster_from_slurm() -> ClusterSpec:
    """The ClusterSpec (with this task) of the current Slurm step, via TF's SlurmClusterResolver."""
    missing = [name for name in _STEP_VARIABLES if not os.environ.get(name)]
    if missing:
        raise ClusterSpecError(missing[0], "not set: Slurm sets it inside a job step",
                               "start the tasks with srun, or set TF_CONFIG yourself")
    num_tasks = int(os.environ["SLURM_STEP_NUM_TASKS"])
    roles = parse_roles(os.environ.get(ROLES_ENV), num_tasks)
    port = _port(os.environ.get(PORT_ENV))
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as slurm

    gpus = _visible_gpus()
    try:
        resolver = slurm.SlurmClusterResolver(
            jobs=roles, port_base=port, auto_set_gpu=bool(gpus),
            # CPU-only nodes: one (unused) slot per task keeps TF's allocation arithmetic valid.
            gpus_per_node=gpus or num_tasks, gpus_per_task=None if gpus else 1)
        jobs = resolver.cluster_spec().as_dict()
    except RuntimeError as err:  # e.g. a node list that does not match the task counts
        raise ClusterSpecError("SLURM_STEP_TASKS_PER_NODE", str(err),
                               "run kdist inside the srun step whose variables these are")
    return ClusterSpec(jobs, resolver.task_type, resolver.task_id, source="Slurm")


def parse_roles(text: str | None, num_tasks: int) -> dict[str, int]:
    """``"chief=1,worker=3"`` -> {"chief": 1, "worker": 3}, checked against the step's task count."""
    if not text:
        return {"worker": num_tasks}
    roles: dict[str, int] = {}
    for part in text.split(","):
        job, sep, count = part.strip().partition("=")
        if not sep or not count.strip().isdigit():
            raise ClusterSpecError(ROLES_ENV, f"{part.strip()!r} is not ROLE=COUNT",
                                   "write e.g. KDIST_SLURM_ROLES=chief=1,worker=3")
        if job.strip() not in JOBS:
            raise ClusterSpecError(f"{ROLES_ENV}.{job.strip()}", "unknown job",
                                   f"use one of {', '.join(JOBS)}")
        roles[job.strip()] = int(count)
    if sum(roles.values()) != num_tasks:
        raise ClusterSpecError(ROLES_ENV, f"{sum(roles.values())} tasks for a step of {num_tasks}",
                               f"make the counts add up to SLURM_STEP_NUM_TASKS={num_tasks}")
    return {job: n for job, n in roles.items() if n}


def _port(text: str | None) -> int:
    if text is None:
        return DEFAULT_PORT
    if not text.isdigit() or not validators.port(int(text)):
        raise ClusterSpecError(PORT_ENV, f"bad port {text!r}", "use a port number from 1 to 65535")
    return int(text)


def _visible_gpus() -> int:
    """GPUs on this node as TF's resolver counts them, without failing where nvidia-smi is absent."""
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))
    if shutil.which("nvidia-smi") is None:
        return 0
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as slurm

    try:
        return slurm.get_num_gpus()
    except RuntimeError:
        return 0
