"""What a pod knows at start, and the TF_CONFIG `kdist exec` derives from it.

Two kinds of pods, told apart by their environment:

- a pod of kdist's Indexed Jobs (`--format jobs`): the cluster kdist computed at render time
  (`KDIST_CLUSTER`), its role (`KDIST_TASK_TYPE`) and the completion index Kubernetes sets
  (`JOB_COMPLETION_INDEX`);
- a pod of a JobSet (`--format jobset`, and the JobSet a Kubeflow Trainer v2 TrainJob becomes):
  the role counts (`KDIST_ROLES`, e.g. ``chief=1,worker=2``, keyed by replicated-job name) and the
  port, plus what JobSet itself gives every pod, read through the downward API: the JobSet's name,
  the pod's replicated job and job index (JobSet's labels), its namespace, and the completion
  index. A pod of JobSet ``demo``, replicated job ``worker``, job 0, completion index 1 is
  ``demo-worker-0-1.demo.<namespace>.svc``.

The TF role of a replicated job is its name; Kubeflow Trainer v2 calls its training nodes
``node``, and those are TF workers.

>>> from kdist.k8s import pod
>>> config = pod.tf_config({"KDIST_ROLES": "chief=1,worker=2", "KDIST_PORT": "2222",
...     "KDIST_JOBSET": "demo", "KDIST_REPLICATED_JOB": "worker", "KDIST_JOB_INDEX": "0",
...     "KDIST_NAMESPACE": "ml", "JOB_COMPLETION_INDEX": "1"})
>>> import json; json.loads(config)["cluster"]["worker"][1]
'demo-worker-0-1.demo.ml.svc:2222'
"""

from __future__ import annotations

import json
import os
import sys

from kdist import envvars, validators
from kdist.cluster.spec import JOBS, ClusterSpec, ClusterSpecError

INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes for Indexed Jobs (JobSet's Jobs are Indexed)

# Indexed Jobs: kdist renders the cluster (envvars.CLUSTER) and the pod's role (envvars.TASK_TYPE).
# JobSet: kdist renders the role counts (envvars.ROLES) and the port (envvars.PORT); JobSet's own
# labels come through the downward API.
JOBSET_FIELDS = {  # env var -> the pod field JobSet fills in
    envvars.JOBSET_NAME: "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
    envvars.REPLICATED_JOB: "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']",
    envvars.JOB_INDEX: "metadata.labels['jobset.sigs.k8s.io/job-index']",
    envvars.NAMESPACE: "metadata.namespace",
}
TRAINER_NODE = "node"  # Kubeflow Trainer v2's replicated job of training nodes: TF workers


def jobset_host(jobset: str, replicated_job: str, index: int, namespace: str) -> str:
    """The DNS name of pod `index` of the one Job of `replicated_job` (JobSet's default
    subdomain is the JobSet's name)."""
    return f"{jobset}-{replicated_job}-0-{index}.{jobset}.{namespace}.svc"


def tf_role(replicated_job: str) -> str:
    """The TF role of the pods of `replicated_job`."""
    if replicated_job == TRAINER_NODE:
        return "worker"
    if replicated_job not in JOBS:
        raise ClusterSpecError(envvars.REPLICATED_JOB, f"{replicated_job!r} is not a TF role",
                               "name each replicated job chief, worker, ps or evaluator (or node, "
                               "Kubeflow Trainer's name for the workers)")
    return replicated_job


def encode_roles(counts: dict[str, int]) -> str:
    """`KDIST_ROLES`'s value: ``{"chief": 1, "worker": 2}`` -> ``"chief=1,worker=2"``."""
    return ",".join(f"{job}={count}" for job, count in counts.items())


def decode_roles(value: str) -> dict[str, int]:
    counts = {}
    for item in value.split(","):
        job, _, count = item.partition("=")
        if not validators.is_digits(count) or not job:
            raise ClusterSpecError(envvars.ROLES, f"{item!r} in {value!r} is not job=count",
                                   "re-render the manifests with kdist (e.g. chief=1,worker=2)")
        counts[job] = int(count)
    return counts


def tf_config(environ=None) -> str:
    """This pod's TF_CONFIG, from its environment (either kind of pod)."""
    environ = os.environ if environ is None else environ
    if envvars.ROLES in environ:
        return _jobset_tf_config(environ)
    _require(environ, (envvars.CLUSTER, envvars.TASK_TYPE, INDEX_ENV))
    try:
        jobs = json.loads(environ[envvars.CLUSTER])
    except json.JSONDecodeError as err:
        raise ClusterSpecError(envvars.CLUSTER, f"not valid JSON ({err.msg})",
                               "re-render the manifests with kdist") from None
    return ClusterSpec(jobs).with_task(environ[envvars.TASK_TYPE], _index(environ)).tf_config_json()


def _jobset_tf_config(environ) -> str:
    _require(environ, (envvars.PORT, INDEX_ENV, *JOBSET_FIELDS))
    if environ[envvars.JOB_INDEX] != "0":
        raise ClusterSpecError(envvars.JOB_INDEX, f"{environ[envvars.JOB_INDEX]!r}: kdist renders "
                               "one Job per replicated job, its pods are the tasks",
                               "keep replicas: 1 and change the pod count (completions, "
                               "parallelism and KDIST_ROLES) instead")
    jobset, namespace, port = (environ[k] for k in (envvars.JOBSET_NAME, envvars.NAMESPACE,
                                                    envvars.PORT))
    counts = decode_roles(environ[envvars.ROLES])
    cluster = ClusterSpec({tf_role(job): [f"{jobset_host(jobset, job, i, namespace)}:{port}"
                                          for i in range(count)]
                           for job, count in counts.items()})
    return cluster.with_task(tf_role(environ[envvars.REPLICATED_JOB]),
                             _index(environ)).tf_config_json()


def _require(environ, names) -> None:
    missing = [name for name in names if name not in environ]
    if missing:
        raise ClusterSpecError(missing[0], "not set: kdist exec runs inside a pod rendered by "
                               "`kdist k8s render` (--format jobs, jobset or trainjob)",
                               "render the manifests with kdist, or set TF_CONFIG yourself")


def _index(environ) -> int:
    index = environ[INDEX_ENV]
    if not validators.is_digits(index):
        raise ClusterSpecError(INDEX_ENV, f"{index!r} is not a completion index",
                               "use completionMode: Indexed")
    return int(index)


def exec_with_tf_config(command: list[str]) -> None:
    """`kdist exec -- COMMAND`: sets TF_CONFIG for this pod, then replaces the process."""
    if not command:
        raise ClusterSpecError("command", "empty", "give the program to run after '--', e.g. "
                               "kdist exec -- python train.py")
    os.environ["TF_CONFIG"] = tf_config()
    sys.stdout.flush()
    os.execvp(command[0], command)
