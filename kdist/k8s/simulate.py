"""`kdist k8s simulate`: run the pods of rendered Indexed Jobs on this machine, each as its own host.

The closest to a Kubernetes cluster one Linux machine allows (root, iproute2): the manifests are
rendered exactly as for `kubectl apply`; every pod gets its own network namespace and address
(`kdist.k8s.netlab`), an ``/etc/hosts`` resolving the pods' Service DNS names, the container's command
and environment, and ``JOB_COMPLETION_INDEX``. So each pod derives its TF_CONFIG with `kdist exec`
and reaches the others by their DNS names, as on the cluster. The pods are supervised by the
`kdist launch` state machine (the job succeeds when the chief, or worker 0, does).

    sudo kdist k8s simulate --spec cluster_specs/k8s-mwms.yaml -- \\
        python examples/mnist_multiworker.py --data=digits --epochs=1

What it does not emulate: images (the command runs from this checkout), resource limits, the
NetworkPolicy (the namespaces share one private bridge) and the Job controller's retries.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import IO

from kdist.cluster.spec import ClusterSpec
from kdist.cluster.spec_file import KubernetesSpec
from kdist.k8s import netlab, render
from kdist.launch import Launcher
from kdist.validators import UsageError


class Pod:
    """One pod of a rendered Indexed Job."""

    def __init__(self, job: dict, index: int):
        container = job["spec"]["template"]["spec"]["containers"][0]
        self.role = job["spec"]["template"]["metadata"]["labels"]["kdist.dev/role"]
        self.index = index
        self.command = list(container["command"])
        self.env = {e["name"]: e["value"] for e in container["env"]}
        self.env[render.INDEX_ENV] = str(index)  # what the Job controller sets


def pods(documents: list[dict]) -> list[Pod]:
    """Every pod the Indexed Jobs among `documents` would create."""
    return [Pod(job, index) for job in documents if job["kind"] == "Job"
            for index in range(job["spec"]["completions"])]


def simulate(spec: KubernetesSpec, command: list[str], namespace: str = "default",
             timeout: float | None = None, output: IO[str] | None = None) -> int:
    """Renders `spec` as Indexed Jobs running `command` and runs every pod; returns the exit code."""
    reason = netlab.unavailable_reason()
    if reason:
        raise UsageError("kdist k8s simulate", reason, "run it as root on Linux with iproute2")
    documents = render.render(spec, command, namespace, image=spec.image or "simulated",
                              fmt="jobs")
    by_task = {(pod.role, pod.index): pod for pod in pods(documents)}

    def host(role: str, index: int) -> str:
        return render.host(spec.name, role, index, namespace)

    roles: dict[str, list[str]] = {}
    for role, index in by_task:
        roles.setdefault(role, []).append(f"{host(role, index)}:{spec.port}")
    with netlab.Network([host(*task) for task in by_task]) as network:

        def pod_command(role: str, index: int) -> tuple[list[str], dict[str, str]]:
            """The pod's container command, run in its host's network namespace."""
            pod = by_task[(role, index)]
            argv = pod.command
            if argv[0] == "kdist" and shutil.which("kdist") is None:
                argv = [sys.executable, "-m", "kdist", *argv[1:]]
            env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
            return network.exec_prefix(host(role, index)) + argv, dict(env, **pod.env)

        launcher = Launcher(ClusterSpec(roles, source=spec.path), None, timeout=timeout,
                            output=output, task_command=pod_command,
                            address_policy=lambda cluster: None)  # every pod is an emulated host
        return launcher.run()
