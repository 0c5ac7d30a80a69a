"""JobSet manifests (`--format jobset`) and a Kubeflow Trainer v2 TrainJob with kdist's TensorFlow
TrainingRuntime (`--format trainjob`), which the Trainer turns into a JobSet.

JobSet (``jobset.x-k8s.io/v1alpha2``): one replicated job per role, named after the role, each one
Indexed Job whose pods are the role's tasks (pod i of role R is
``<name>-<R>-0-<i>.<name>.<namespace>.svc``, under the headless Service JobSet manages). No
TF_CONFIG is written into the YAML: each pod's `kdist exec` derives it from the role counts
(`KDIST_ROLES`), the port, and what JobSet gives the pod (`kdist.k8s.pod`).

- Success: the chief's Job completing (worker 0's job when there is no chief: all workers);
  ps pods then stop with the JobSet.
- Failure (`kdist.k8s.restarts`): an evicted pod, or one that saved its backup on SIGTERM (exit
  75), is replaced in place. Any other failure fails its Job (backoffLimit 0), and JobSet
  recreates the whole set, up to the spec's `backoff_limit` times (`failurePolicy.maxRestarts`):
  MultiWorkerMirrored needs every worker back, and they resume together from the backup. A usage
  error or a missing program (exit 2, 126, 127) fails the JobSet at once.

Kubeflow Trainer v2 (``trainer.kubeflow.org/v1alpha1``) dropped its TensorFlow runtime;
`trainjob` renders one (`TrainingRuntime` ``kdist-tensorflow``: replicated job ``node``, the
Trainer's name for its training nodes, container ``node`` started by ``kdist exec --``) and a
`TrainJob` that runs `command` on `numNodes` workers (MultiWorkerMirrored; Trainer scales only its
nodes, so a chief or ps layout needs `--format jobset`).
"""

from __future__ import annotations

import dataclasses

from kdist import envvars
from kdist.cluster.spec import ClusterSpecError
from kdist.cluster.spec_file import KubernetesSpec
from kdist.k8s import pod, pod_settings, restarts, security

API_VERSION = "jobset.x-k8s.io/v1alpha2"
TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME_NAME = "kdist-tensorflow"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # the Trainer finds its nodes by it


def downward_env() -> list[dict]:
    """The env entries that hand JobSet's labels (and the namespace) to `kdist exec`."""
    return [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for name, path in pod.JOBSET_FIELDS.items()]


def _job_template(spec: KubernetesSpec, container: dict, pod_labels: dict, count: int | None,
                  job_labels: dict | None = None) -> dict:
    """An Indexed Job of `count` pods (None: the Trainer sets it from numNodes), backoffLimit 0."""
    job = {"completionMode": "Indexed"}
    if count is not None:
        job.update(completions=count, parallelism=count)
    job["backoffLimit"] = 0
    if spec.restart_policy == "Never":  # Kubernetes allows a podFailurePolicy only with Never
        job["podFailurePolicy"] = restarts.pod_failure_policy(container["name"])
    pod_spec = {"restartPolicy": spec.restart_policy, "containers": [container]}
    template = {"metadata": {"labels": pod_labels}, "spec": pod_spec} if pod_labels else \
        {"spec": pod_spec}
    job["template"] = pod_settings.finish(template, spec)
    return {"metadata": {"labels": job_labels}, "spec": job} if job_labels else {"spec": job}


def _set_policies(spec: KubernetesSpec, replicated_jobs: list[dict], target: str) -> dict:
    return {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [target]},
            "failurePolicy": {"maxRestarts": spec.backoff_limit,
                              "rules": restarts.JOBSET_FAILURE_RULES},
            "replicatedJobs": replicated_jobs}


def jobset(spec: KubernetesSpec, command: list[str], namespace: str, labels: dict,
           container) -> dict:
    """The JobSet of `spec`; `container(role, command, env)` builds each role's container."""
    roles = pod.encode_roles({r: n for r, n in spec.roles.items() if r != "evaluator"})
    entries = [{"name": envvars.ROLES, "value": roles},
               {"name": envvars.PORT, "value": str(spec.port)}, *downward_env()]
    replicated = [{"name": role, "replicas": 1,
                   "template": _job_template(spec, container(role, ["kdist", "exec", "--", *command],
                                                             entries),
                                             dict(labels, **{"kdist.dev/role": role}), count)}
                  for role, count in spec.roles.items()]
    target = "chief" if "chief" in spec.roles else "worker"
    return {"apiVersion": API_VERSION, "kind": "JobSet",
            "metadata": {"name": spec.name, "namespace": namespace, "labels": labels},
            "spec": _set_policies(spec, replicated, target)}


def trainjob(spec: KubernetesSpec, command: list[str], image: str, namespace: str) -> list[dict]:
    """kdist's TensorFlow TrainingRuntime and a TrainJob running `command` on it."""
    others = sorted(set(spec.roles) - {"worker"})
    if others:
        raise ClusterSpecError(f"{spec.path}.roles", f"Kubeflow Trainer v2 runs one group of "
                               f"training nodes; this spec also has {', '.join(others)}",
                               "use roles: {worker: N} (MultiWorkerMirrored), or --format jobset")
    placed = sorted(set(spec.pod_keys) - {"env"})
    if placed:
        raise ClusterSpecError(f"{spec.path}.{placed[0]}", "goes into the pod template, and a "
                               "TrainJob's pod template is the TrainingRuntime that jobs share",
                               "use --format jobset (or jobs) for a spec with "
                               + ", ".join(placed))
    job_env = [{"name": k, "value": v} for k, v in spec.pod_keys.get("env", {}).items()]
    spec = dataclasses.replace(spec, pod_keys={})  # the shared runtime carries no job's keys
    container = {"name": pod.TRAINER_NODE, "image": image, "command": ["kdist", "exec", "--"],
                 "env": downward_env(), "terminationMessagePolicy": "FallbackToLogsOnError"}
    node = {"name": pod.TRAINER_NODE,
            "template": _job_template(spec, container, {}, None, {ANCESTOR_LABEL: "trainer"})}
    runtime = {"apiVersion": TRAINER_API_VERSION, "kind": "TrainingRuntime",
               "metadata": {"name": RUNTIME_NAME, "namespace": namespace,
                            "labels": {"trainer.kubeflow.org/framework": "tensorflow"}},
               "spec": {"mlPolicy": {"numNodes": 1},
                        "template": {"spec": _set_policies(spec, [node], pod.TRAINER_NODE)}}}
    workers = spec.roles["worker"]
    trainer = {"numNodes": workers, "image": image, "args": list(command),
               "env": [{"name": envvars.ROLES,
                        "value": pod.encode_roles({pod.TRAINER_NODE: workers})},
                       {"name": envvars.PORT, "value": str(spec.port)},
                       *security.ring_env(spec), *job_env]}
    if spec.resources.get("worker"):
        trainer["resourcesPerNode"] = spec.resources["worker"]
    train_job = {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob",
                 "metadata": {"name": spec.name, "namespace": namespace},
                 "spec": {"runtimeRef": {"name": RUNTIME_NAME, "kind": "TrainingRuntime",
                                         "apiGroup": "trainer.kubeflow.org"},
                          "trainer": trainer}}
    return [runtime, train_job]
