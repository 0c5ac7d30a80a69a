"""Every ``KDIST_*`` environment variable: what it means, who writes it and who reads it.

They are the contract between kdist's process side (`kdist launch`, `kdist verify`, the
Kubernetes manifests and `kdist exec`) and the runtime inside the user's program, plus the
settings a user exports. Code names a variable only through the constants here; this module
imports nothing of kdist's and never TensorFlow. docs/environment.md is generated from it:

    python -m kdist.envvars > docs/environment.md

>>> CONTRACT[RING_PORT].read_by
'kdist.exchange.comm (the TCP ring)'
>>> CONTRACT[RESTART_COUNT].written_by
'`kdist launch`'
"""

from __future__ import annotations

import dataclasses

USER = "you"
LAUNCH = "`kdist launch`"
MANIFESTS = "`kdist k8s render`'s manifests"
JOBSET = "`kdist k8s render --format jobset` (and `trainjob`)"


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    meaning: str
    written_by: str
    read_by: str


# ---------------------------------------------------------------- what a user may set
STRATEGY = "KDIST_STRATEGY"
EAGER_MULTI_WORKER = "KDIST_EAGER_MULTI_WORKER"
STARTUP_TIMEOUT = "KDIST_STARTUP_TIMEOUT"
HANG_TIMEOUT = "KDIST_HANG_TIMEOUT"
HANG_ACTION = "KDIST_HANG_ACTION"
RING_PORT = "KDIST_RING_PORT"
JOB_SECRET = "KDIST_JOB_SECRET"
SLURM_PORT = "KDIST_SLURM_PORT"
SLURM_ROLES = "KDIST_SLURM_ROLES"
CHIEF_GRACE = "KDIST_CHIEF_GRACE"
CHIEF_START_TIMEOUT = "KDIST_CHIEF_START_TIMEOUT"
# ---------------------------------------------------------------- what kdist's tools set
FAILURE_FILE = "KDIST_FAILURE_FILE"
RESTART_COUNT = "KDIST_RESTART_COUNT"
WORLD_SIZE_CHANGE = "KDIST_WORLD_SIZE_CHANGE"
VERIFY = "KDIST_VERIFY"
SLURM_NODE_GPUS = "KDIST_SLURM_NODE_GPUS"
CLUSTER = "KDIST_CLUSTER"
TASK_TYPE = "KDIST_TASK_TYPE"
ROLES = "KDIST_ROLES"
PORT = "KDIST_PORT"
JOBSET_NAME = "KDIST_JOBSET"
REPLICATED_JOB = "KDIST_REPLICATED_JOB"
JOB_INDEX = "KDIST_JOB_INDEX"
NAMESPACE = "KDIST_NAMESPACE"

_VARIABLES = (
    Variable(STRATEGY, "overrides `strategy=\"auto\"`: `default`, `mirrored`, `multi_worker`, "
             "`parameter_server` ([Strategies](strategies.md))",
             f"{USER}; `kdist verify` (`default`, its one-device run)",
             "kdist.scope; `import kdist` (the eager multi-worker start)"),
    Variable(EAGER_MULTI_WORKER, "`0`: do not build MultiWorkerMirroredStrategy before "
             "TensorFlow's first op when TF_CONFIG names several workers (then create it with "
             "`kdist.strategy()` before any op)", USER, "`import kdist`"),
    Variable(STARTUP_TIMEOUT, "seconds every task waits for its peers at start-up before it "
             "fails naming the absent ones (default 600; `kdist.strategy(startup_timeout=...)`)",
             USER, "kdist.startup; kdist.ps.serve"),
    Variable(HANG_TIMEOUT, "seconds without a step before the hang watchdog reports where each "
             "worker is (`kdist.scope(hang_timeout=...)`; [Diagnosing](diagnosing.md))", USER,
             "kdist.steps.watchdog"),
    Variable(HANG_ACTION, "`exit`: a detected hang exits with code 76 instead of only reporting "
             "(`report`, the default)", USER, "kdist.steps.watchdog"),
    Variable(CHIEF_GRACE, "parameter servers: seconds the chief may be unreachable before the "
             "ps and worker servers (`kdist.serve()`) exit (default 10)", USER, "kdist.ps.serve"),
    Variable(CHIEF_START_TIMEOUT, "parameter servers: seconds the servers wait for the chief to "
             f"come up (default: `{STARTUP_TIMEOUT}`)", USER, "kdist.ps.serve"),
    Variable(SLURM_PORT, "Slurm: the base port of the tasks (default 8888; [Slurm](slurm.md))",
             f"{USER} (the batch script)", "kdist.cluster.slurm"),
    Variable(SLURM_ROLES, "Slurm: ranks to roles, e.g. `chief=1,worker=2,ps=1` (default: every "
             "task a worker)", f"{USER} (the batch script)", "kdist.cluster.slurm"),
    Variable(SLURM_NODE_GPUS, "Slurm: the node's GPUs before kdist shared them among its tasks "
             "(shared once)", "kdist.cluster.slurm, in the task", "kdist.cluster.slurm"),
    Variable(JOB_SECRET, "the job's secret for kdist's TCP ring handshake: the same on every "
             "task; strangers are refused ([Security](security.md))",
             f"{LAUNCH} (a fresh one per job when unset); {MANIFESTS}, from a Secret; {USER} "
             "(one value on every machine)", "kdist.exchange.comm (the TCP ring)"),
    Variable(RING_PORT, "the port of kdist's TCP ring (any free port when unset); each worker "
             "on a host needs its own", f"{MANIFESTS}: the TensorFlow port + 1; {USER}",
             "kdist.exchange.comm (the TCP ring)"),
    Variable(RESTART_COUNT, "how many times the group was restarted; resume from your backup",
             LAUNCH, "your program"),
    Variable(WORLD_SIZE_CHANGE, "`N->K` after an elastic restart on fewer workers", LAUNCH,
             "your program"),
    Variable(VERIFY, "the folder where `kdist verify`'s two runs record and replay the first "
             "`fit` ([Diagnosing](diagnosing.md#the-same-training-as-one-device-kdist-verify))",
             "`kdist verify`", "kdist.verify_plan"),
    Variable(FAILURE_FILE, "where a task records its exception for the launch summary (set, "
             "the task also writes its threads' stacks on SIGUSR1)",
             f"{LAUNCH}; `kdist verify`", "kdist.failure, in the task; the launcher"),
    Variable(CLUSTER, "Indexed Jobs: the job's cluster (TF_CONFIG's `cluster`, JSON)",
             MANIFESTS, "`kdist exec` (kdist.k8s.pod), which writes the pod's TF_CONFIG"),
    Variable(TASK_TYPE, "Indexed Jobs: this pod's role", MANIFESTS, "`kdist exec`"),
    Variable(ROLES, "JobSet: pods per replicated job, e.g. `chief=1,worker=2`", JOBSET,
             "`kdist exec`"),
    Variable(PORT, "JobSet: the port every task listens on", JOBSET, "`kdist exec`"),
    Variable(JOBSET_NAME, "JobSet: the JobSet's name (its label, by the downward API)", JOBSET,
             "`kdist exec`"),
    Variable(REPLICATED_JOB, "JobSet: this pod's replicated job (its label)", JOBSET,
             "`kdist exec`"),
    Variable(JOB_INDEX, "JobSet: the index of this pod's Job in its replicated job (its label)",
             JOBSET, "`kdist exec`"),
    Variable(NAMESPACE, "JobSet: the pod's namespace (by the downward API)", JOBSET,
             "`kdist exec`"),
)
CONTRACT = {variable.name: variable for variable in _VARIABLES}


def render() -> str:
    """docs/environment.md."""
    lines = ["# Environment variables", "",
             "Every `KDIST_*` variable kdist reads or sets: what it means, who writes it and who "
             "reads it. Those you write are settings; the others are how `kdist launch`, `kdist "
             "verify`, the Kubernetes manifests and the Slurm integration talk to the processes "
             "they start: you read them, you do not set them. Generated from `kdist/envvars.py` "
             "(`python -m kdist.envvars > docs/environment.md`), where code names them.", "",
             "| variable | what it does | written by | read by |", "|---|---|---|---|"]
    for v in _VARIABLES:
        lines.append(f"| `{v.name}` | {v.meaning} | {v.written_by} | {v.read_by} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
