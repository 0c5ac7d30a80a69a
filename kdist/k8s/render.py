"""Kubernetes manifests from a cluster-spec file: plain Indexed Jobs, a Kubeflow TFJob, a JobSet
or a Kubeflow Trainer v2 TrainJob (the last two in `kdist.k8s.jobset`).

    kdist k8s render --spec cluster_specs/k8s-mwms.yaml --image registry/train:1 -- python train.py

`jobs` (no operator needed): one headless Service for the job and one Indexed Job per role. A pod of
role R with completion index i is reachable as ``<job>-<R>-<i>.<job>.<namespace>.svc``; kdist
computes the whole cluster at render time and each pod derives its own TF_CONFIG at start from its
`JOB_COMPLETION_INDEX` (`kdist exec`), so no TF_CONFIG is written by hand into YAML.

`tfjob`: a Kubeflow TFJob (replica types Chief, Worker, PS, Evaluator, never Master; the container
is named `tensorflow`; the operator writes TF_CONFIG).

Each comes with a NetworkPolicy that admits the gRPC port (and kdist's TCP ring's, the next one)
only from the job's own pods: TensorFlow's runtime is unauthenticated. Every pod reads the job's
secret, which every member of the TCP ring proves (`kdist.exchange.ring`), from a Secret that is
not rendered (renders of the same inputs are identical and hold no secret): it is created once
(`kdist.k8s.security.create_secret_command`). Every pod runs as the Pod Security Standards' `restricted` profile
requires (`kdist.k8s.security`), unless the spec says its image must run as root. ps and worker pods finish when the chief does (`kdist.serve()`). With
restart_policy Never, each Job's podFailurePolicy replaces evicted pods and pods that exited with
75 (checkpoint saved on SIGTERM) without spending the backoffLimit, which counts real failures, and
fails the Job at once on an exit no restart can fix (2: usage, 126/127: no program).
"""

from __future__ import annotations

import json

from kdist import envvars
from kdist.cluster.spec import ClusterSpec, ClusterSpecError
from kdist.cluster.spec_file import KubernetesSpec
from kdist.k8s import jobset, pod_settings, restarts, security

FORMATS = ("jobs", "tfjob", "jobset", "trainjob")
TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
LABEL = "kdist.dev/job"


# The DNS name of a pod of an Indexed Job under the job's headless Service.
HOST_PATTERN = "{job}-{role}-{index}.{job}.{namespace}.svc"
_PLACEHOLDERS = ("job", "role", "index", "namespace")


def host(job: str, role: str, index: int, namespace: str, pattern: str = HOST_PATTERN) -> str:
    """The host name of task `role:index` of `job` under `pattern` (default: Kubernetes DNS):
    its placeholders, plain, and nothing else (no attribute, index, conversion or format)."""
    check_pattern(pattern)
    return pattern.format(job=job, role=role, index=index, namespace=namespace)


def check_pattern(pattern: str) -> set[str]:
    """The placeholders of a --host-pattern; refuses anything but the documented ones, plain."""
    import string

    fix = "use only the placeholders " + ", ".join("{%s}" % p for p in _PLACEHOLDERS) + \
        " (write {{ and }} for literal braces)"
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion
                  in string.Formatter().parse(pattern) if name is not None]
    except ValueError as err:
        raise ClusterSpecError("--host-pattern", f"{pattern!r}: {err}", fix) from None
    for name, spec, conversion in fields:
        if name not in _PLACEHOLDERS or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + \
                (f":{spec}" if spec else "") + "}"
            raise ClusterSpecError("--host-pattern", f"{shown} in {pattern!r} is not a "
                                   "placeholder", fix)
    return {name for name, _, _ in fields}


def kubernetes_cluster(spec: KubernetesSpec, namespace: str, host_pattern: str = HOST_PATTERN) -> ClusterSpec:
    """The training cluster of a deployed job: one `host()` per task, all on the spec's port.

    The evaluator is not part of it: nobody connects to an evaluator, and TF accepts a TF_CONFIG
    whose task is ``evaluator:0`` with the training cluster (the TFJob operator does the same).
    """
    if not {"role", "index"} <= check_pattern(host_pattern):
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
    if fmt not in FORMATS:
        raise ClusterSpecError("--format", f"{fmt!r} is not a format", "use " + ", ".join(FORMATS))
    cluster = kubernetes_cluster(spec, namespace)  # validates the roles as TF would
    labels = {LABEL: spec.name}
    if fmt == "jobs":
        documents = _jobs(spec, cluster, command, image, namespace)
    elif fmt == "tfjob":
        documents = [_tfjob(spec, command, image, namespace)]
    elif fmt == "jobset":
        documents = [jobset.jobset(spec, command, namespace, labels, lambda role, argv, entries:
                                   _container(spec, role, image, argv, entries))]
    else:  # the TrainJob's pods carry JobSet's labels, not kdist's (the runtime is shared)
        documents = jobset.trainjob(spec, command, image, namespace)
        labels = {"jobset.sigs.k8s.io/jobset-name": spec.name}
    return [*documents, _network_policy(spec, namespace, labels)]


def _container(spec, role, image, command, entries):
    container = {"name": "tensorflow", "image": image, "command": command,
                 "ports": [{"name": "grpc", "containerPort": spec.port},
                           {"name": "ring", "containerPort": spec.port + 1}],
                 "env": [*entries, *security.ring_env(spec)],
                 # a task's failure record (kdist.failure), else the end of its log
                 "terminationMessagePolicy": "FallbackToLogsOnError"}
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
        entries = [{"name": envvars.CLUSTER, "value": cluster_json},
                   {"name": envvars.TASK_TYPE, "value": role}]
        template = pod_settings.finish({
            "metadata": {"labels": {LABEL: name, "kdist.dev/role": role}},
            "spec": {"subdomain": name, "restartPolicy": spec.restart_policy,
                     "containers": [_container(spec, role, image,
                                               ["kdist", "exec", "--", *command], entries)]}}, spec)
        job_spec = {"completionMode": "Indexed", "completions": count, "parallelism": count,
                    "backoffLimit": spec.backoff_limit, "template": template}
        if spec.restart_policy == "Never":  # Kubernetes allows the policy only with Never
            job_spec["podFailurePolicy"] = restarts.pod_failure_policy("tensorflow")
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
            "template": pod_settings.finish({
                "metadata": {"labels": {LABEL: name}},
                "spec": {"containers": [_container(spec, role, image, command, [])]}}, spec)}
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
            "metadata": {"name": name, "namespace": namespace, "labels": {LABEL: name}},
            "spec": {"runPolicy": {"backoffLimit": spec.backoff_limit},
                     "tfReplicaSpecs": replicas}}


def _network_policy(spec, namespace, labels):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"{spec.name}-grpc", "namespace": namespace},
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": labels}}],
                                  "ports": [{"protocol": "TCP", "port": spec.port},
                                            {"protocol": "TCP", "port": spec.port + 1}]}]}}


def to_yaml(documents: list[dict]) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # a list shared by two pods is written out twice
            return True

    return "---\n".join(yaml.dump(d, Dumper=Dumper, sort_keys=False) for d in documents)
