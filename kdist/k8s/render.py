"""Kubernetes manifests from a cluster-spec file: plain Indexed Jobs or a Kubeflow TFJob.

    kdist k8s render --spec cluster_specs/k8s-mwms.yaml --image registry/train:1 -- python train.py

`jobs` (no operator needed): one headless Service for the job and one Indexed Job per role. A pod of
role R with completion index i is reachable as ``<job>-<R>-<i>.<job>.<namespace>.svc``; kdist
computes the whole cluster at render time and each pod derives its own TF_CONFIG at start from its
`JOB_COMPLETION_INDEX` (`kdist exec`), so no TF_CONFIG is written by hand into YAML.

`tfjob`: a Kubeflow TFJob (replica types Chief, Worker, PS, Evaluator, never Master; the container
is named `tensorflow`; the operator writes TF_CONFIG).

Both come with a NetworkPolicy that admits the gRPC port only from the job's own pods: TensorFlow's
runtime is unauthenticated. ps and worker pods finish when the chief does (`kdist.serve()`). With
restart_policy Never, each Job's podFailurePolicy replaces evicted pods and pods that exited with
75 (checkpoint saved on SIGTERM) without spending the backoffLimit, which counts real failures.
"""

from __future__ import annotations

import json
import os
import sys

from kdist import exit_codes
from kdist.cluster.spec import ClusterSpec, ClusterSpecError
from kdist.cluster.spec_file import KubernetesSpec

CLUSTER_ENV = "KDIST_CLUSTER"  # the job's cluster (TF_CONFIG's "cluster"), computed by kdist
ROLE_ENV = "KDIST_TASK_TYPE"  # this pod's role
INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes for Indexed Jobs
TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
LABEL = "kdist.dev/job"
# A pod evicted or preempted (DisruptionTarget), or one that saved its backup on SIGTERM and exited
# with exit_codes.PREEMPTED, is replaced without counting against backoffLimit: it resumes from its backup.
POD_FAILURE_POLICY = {"rules": [
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "Ignore", "onExitCodes": {"containerName": "tensorflow", "operator": "In",
                                         "values": [exit_codes.PREEMPTED]}}]}


# The DNS name of a pod of an Indexed Job under the job's headless Service.
HOST_PATTERN = "{job}-{role}-{index}.{job}.{namespace}.svc"
_PLACEHOLDERS = ("job", "role", "index", "namespace")


def host(job: str, role: str, index: int, namespace: str, pattern: str = HOST_PATTERN) -> str:
    """The host name of task `role:index` of `job` under `pattern` (default: Kubernetes DNS)."""
    try:
        return pattern.format(job=job, role=role, index=index, namespace=namespace)
    except (KeyError, IndexError, ValueError) as err:
        raise ClusterSpecError("--host-pattern", f"{pattern!r} cannot be filled in ({err!r})",
                               "use only the placeholders " +
                               ", ".join("{%s}" % p for p in _PLACEHOLDERS)) from None


def kubernetes_cluster(spec: KubernetesSpec, namespace: str, host_pattern: str = HOST_PATTERN) -> ClusterSpec:
    """The training cluster of a deployed job: one `host()` per task, all on the spec's port.

    The evaluator is not part of it: nobody connects to an evaluator, and TF accepts a TF_CONFIG
    whose task is ``evaluator:0`` with the training cluster (the TFJob operator does the same).
    """
    if "{role}" not in host_pattern or "{index}" not in host_pattern:
        raise ClusterSpecError("--host-pattern", f"{host_pattern!r} lacks {{role}} or {{index}}, so "
                               "tasks would share a host name",
                               "include both, e.g. '{job}-{role}-{index}.example.org'")
    roles, port = spec.roles, spec.port
    return ClusterSpec({role: [f"{host(spec.name, role, i, namespace, host_pattern)}:{port}"
                               for i in range(n)]
                        for role, n in roles.items() if n and role != "evaluator"},
                       source=spec.path)


def render(spec: KubernetesSpec, command: list[str], namespace: str = "default", image: str | None = None,
           fmt: str = "jobs") -> list[dict]:
    """The manifests for `spec` (`kdist.cluster.spec_file.read_k8s_spec`) running `command`."""
    image = image or spec.image
    if not image:
        raise ClusterSpecError(f"{spec.path}.image", "missing: Kubernetes needs a container image",
                               "add image: to the spec or pass --image")
    command = list(command or spec.command or [])
    if not command:
        raise ClusterSpecError(f"{spec.path}.command", "missing: nothing to run in the pods",
                               "add command: [python, train.py] to the spec or pass -- python train.py")
    if fmt not in ("jobs", "tfjob"):
        raise ClusterSpecError("--format", f"{fmt!r} is not a format", "use jobs or tfjob")
    cluster = kubernetes_cluster(spec, namespace)  # validates the roles as TF would
    documents = _jobs(spec, cluster, command, image, namespace) if fmt == "jobs" else \
        [_tfjob(spec, command, image, namespace)]
    return documents + [_network_policy(spec, namespace)]


def _container(spec, role, image, command, env):
    container = {"name": "tensorflow", "image": image, "command": command,
                 "ports": [{"name": "grpc", "containerPort": spec.port}], "env": env}
    resources = spec.resources.get(role)
    if resources:
        container["resources"] = resources
    return container


def _jobs(spec, cluster, command, image, namespace):
    name = spec.name
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": namespace, "labels": {LABEL: name}},
               "spec": {"clusterIP": "None", "selector": {LABEL: name},
                        "ports": [{"name": "grpc", "port": spec.port}]}}
    cluster_json = json.dumps(cluster.jobs, separators=(",", ":"))
    jobs = []
    for role, count in spec.roles.items():
        env = [{"name": CLUSTER_ENV, "value": cluster_json}, {"name": ROLE_ENV, "value": role}]
        pod = {"metadata": {"labels": {LABEL: name, "kdist.dev/role": role}},
               "spec": {"subdomain": name, "restartPolicy": spec.restart_policy,
                        "containers": [_container(spec, role, image,
                                                  ["kdist", "exec", "--", *command], env)]}}
        job_spec = {"completionMode": "Indexed", "completions": count, "parallelism": count,
                    "backoffLimit": spec.backoff_limit, "template": pod}
        if spec.restart_policy == "Never":  # Kubernetes allows the policy only with Never
            job_spec["podFailurePolicy"] = POD_FAILURE_POLICY
        jobs.append({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"name": f"{name}-{role}", "namespace": namespace,
                                  "labels": {LABEL: name}},
                     "spec": job_spec})
    return [service, *jobs]


def _tfjob(spec, command, image, namespace):
    name = spec.name
    replicas = {}
    for role, count in spec.roles.items():
        replicas[TFJOB_TYPES[role]] = {
            "replicas": count, "restartPolicy": spec.restart_policy,
            "template": {"metadata": {"labels": {LABEL: name}},
                         "spec": {"containers": [_container(spec, role, image, command, [])]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
            "metadata": {"name": name, "namespace": namespace, "labels": {LABEL: name}},
            "spec": {"runPolicy": {"backoffLimit": spec.backoff_limit},
                     "tfReplicaSpecs": replicas}}


def _network_policy(spec, namespace):
    name = spec.name
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"{name}-grpc", "namespace": namespace},
            "spec": {"podSelector": {"matchLabels": {LABEL: name}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {LABEL: name}}}],
                                  "ports": [{"protocol": "TCP", "port": spec.port}]}]}}


def to_yaml(documents: list[dict]) -> str:
    import yaml

    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in documents)


def pod_tf_config(environ=None) -> str:
    """In a pod of a rendered Indexed Job: this pod's TF_CONFIG, from the environment."""
    environ = os.environ if environ is None else environ
    missing = [k for k in (CLUSTER_ENV, ROLE_ENV, INDEX_ENV) if k not in environ]
    if missing:
        raise ClusterSpecError(missing[0], "not set: kdist exec runs inside a pod rendered by "
                               "`kdist k8s render --format jobs`",
                               "render the manifests with kdist, or set TF_CONFIG yourself")
    try:
        jobs = json.loads(environ[CLUSTER_ENV])
    except json.JSONDecodeError as err:
        raise ClusterSpecError(CLUSTER_ENV, f"not valid JSON ({err.msg})",
                               "re-render the manifests with kdist") from None
    index = environ[INDEX_ENV]
    if not index.isdigit():
        raise ClusterSpecError(INDEX_ENV, f"{index!r} is not a completion index",
                               "use completionMode: Indexed")
    return ClusterSpec(jobs).with_task(environ[ROLE_ENV], int(index)).tf_config_json()


def exec_with_tf_config(command: list[str]) -> None:
    """`kdist exec -- COMMAND`: sets TF_CONFIG for this pod, then replaces the process."""
    if not command:
        raise ClusterSpecError("command", "empty", "give the program to run after '--', e.g. "
                               "kdist exec -- python train.py")
    os.environ["TF_CONFIG"] = pod_tf_config()
    sys.stdout.flush()
    os.execvp(command[0], command)

