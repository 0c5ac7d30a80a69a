"""`kdist k8s simulate`: run the pods of rendered Indexed Jobs or a JobSet on this machine, each as
its own host.

The closest to a Kubernetes cluster one Linux machine allows (root, iproute2): the manifests are
rendered exactly as for `kubectl apply`; every pod gets its own network namespace and address
(`kdist.k8s.netlab`), an ``/etc/hosts`` resolving the pods' Service DNS names, the container's command
and environment, ``JOB_COMPLETION_INDEX``, and for a JobSet the labels JobSet sets (read by
the pods through the downward API). So each pod derives its TF_CONFIG with `kdist exec`
and reaches the others by their DNS names, as on the cluster. The pods are supervised by the
`kdist launch` state machine (the job succeeds when the chief, or worker 0, does).

    sudo kdist k8s simulate --spec cluster_specs/k8s-mwms.yaml [--format jobset] -- \\
        python examples/mnist_multiworker.py --data=digits --epochs=1

What it does not emulate: images (the command runs from this checkout), resource limits, the
NetworkPolicy (the namespaces share one private bridge), and the Job and JobSet controllers' retries
and success policies (the launcher's rules stand in for them).
"""

from __future__ import annotations

import collections
import os
import shutil
import sys
from secrets import token_hex
from typing import IO

from kdist.cluster.spec import ClusterSpec
from kdist.cluster.spec_file import KubernetesSpec
from kdist.k8s import netlab, pod, render
from kdist.launch import Launcher
from kdist.validators import UsageError


class Pod:
    """One pod of a rendered Indexed Job or JobSet: its task, DNS name, command and environment,
    with what the Job and JobSet controllers would set (the completion index, JobSet's labels)."""

    def __init__(self, template: dict, index: int, host: str, role: str, fields: dict[str, str],
                 secrets: dict[tuple[str, str], str]):
        container = template["spec"]["containers"][0]
        self.role, self.index, self.host = role, index, host
        self.command = list(container["command"])
        self.env = {e["name"]: _value(e, fields, secrets) for e in container["env"]}
        self.env[pod.INDEX_ENV] = str(index)


def _value(env: dict, fields: dict[str, str], secrets: dict[tuple[str, str], str]) -> str:
    """An environment variable's value: given, from the downward API or from a Secret."""
    if "value" in env:
        return env["value"]
    source = env["valueFrom"]
    if "fieldRef" in source:
        return fields[source["fieldRef"]["fieldPath"]]
    ref = source["secretKeyRef"]
    return secrets[(ref["name"], ref["key"])]


def pods(documents: list[dict], namespace: str) -> list[Pod]:
    """Every pod the Indexed Jobs or the JobSet among `documents` would create."""
    # The Secrets the pods read (never rendered): one random value each, as `kubectl create
    # secret` makes it once for a real job (security.create_secret_command).
    secrets = collections.defaultdict(lambda: token_hex(16))
    found = []
    for document in documents:
        if document["kind"] == "Job":
            template = document["spec"]["template"]
            role = template["metadata"]["labels"]["kdist.dev/role"]
            job = document["metadata"]["labels"][render.LABEL]
            found += [Pod(template, i, render.host(job, role, i, namespace), role, {},
                          secrets)
                      for i in range(document["spec"]["completions"])]
        elif document["kind"] == "JobSet":
            name = document["metadata"]["name"]
            for replicated in document["spec"]["replicatedJobs"]:
                job = replicated["template"]["spec"]
                fields = _jobset_fields(name, replicated["name"], namespace)
                found += [Pod(job["template"], i, pod.jobset_host(name, replicated["name"], i,
                                                                  namespace),
                              pod.tf_role(replicated["name"]), fields, secrets)
                          for i in range(job["completions"])]
    return found


def _jobset_fields(jobset: str, replicated_job: str, namespace: str) -> dict[str, str]:
    """The downward-API fields of a JobSet pod (replicas: 1, so job index 0)."""
    labels = {"jobset-name": jobset, "replicatedjob-name": replicated_job, "job-index": "0"}
    fields = {f"metadata.labels['jobset.sigs.k8s.io/{key}']": value for key, value in labels.items()}
    return dict(fields, **{"metadata.namespace": namespace})


def simulate(spec: KubernetesSpec, command: list[str], namespace: str = "default",
             timeout: float | None = None, output: IO[str] | None = None, fmt: str = "jobs") -> int:
    """Renders `spec` as Indexed Jobs (or a JobSet) running `command` and runs every pod; returns
    the exit code."""
    reason = netlab.unavailable_reason()
    if reason:
        raise UsageError("kdist k8s simulate", reason, "run it as root on Linux with iproute2")
    if fmt not in ("jobs", "jobset"):
        raise UsageError("--format", f"{fmt!r} cannot be rehearsed", "use jobs or jobset")
    documents = render.render(spec, command, namespace, image=spec.image or "simulated", fmt=fmt)
    by_task = {(p.role, p.index): p for p in pods(documents, namespace)}

    roles: dict[str, list[str]] = {}
    for (role, _), p in by_task.items():
        roles.setdefault(role, []).append(f"{p.host}:{spec.port}")
    with netlab.Network([p.host for p in by_task.values()]) as network:

        def pod_command(role: str, index: int) -> tuple[list[str], dict[str, str]]:
            """The pod's container command, run in its host's network namespace."""
            p = by_task[(role, index)]
            argv = p.command
            if argv[0] == "kdist" and shutil.which("kdist") is None:
                argv = [sys.executable, "-m", "kdist", *argv[1:]]
            env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
            return network.exec_prefix(p.host) + argv, dict(env, **p.env)

        launcher = Launcher(ClusterSpec(roles, source=spec.path), None, timeout=timeout,
                            output=output, task_command=pod_command,
                            placement=ClusterSpec.tasks,  # every pod is an emulated host
                            network="host")  # each pod enters its own host's namespace
        return launcher.run()
