"""`kdist k8s simulate`: run the pods of rendered Indexed Jobs on this machine, each as its own host.

The closest to a Kubernetes cluster one Linux machine allows (root, iproute2): the manifests are
rendered exactly as for `kubectl apply`; every pod gets its own network namespace and address
(`kdist.netlab`), an ``/etc/hosts`` resolving the pods' Service DNS names, the container's command
and environment, and ``JOB_COMPLETION_INDEX``. So each pod derives its TF_CONFIG with `kdist exec`
and reaches the others by their DNS names, as on the cluster. The pods are supervised by the
`kdist launch` state machine (the job succeeds when the chief, or worker 0, does).

    sudo kdist k8s simulate --spec cluster_specs/k8s-mwms.yaml -- \\
        python examples/mnist_multiworker.py --data=digits --epochs=1

What it does not emulate: images (the command runs from this checkout), resource limits, the
NetworkPolicy (the namespaces share one private bridge) and the Job controller's retries.
"""

from __future__ import annotations

import shutil
import sys
from typing import IO

from kdist import k8s, netlab
from kdist.cluster import ClusterSpec
from kdist.launcher import Launcher


class Pod:
    """One pod of a rendered Indexed Job."""

    def __init__(self, job: dict, index: int):
        container = job["spec"]["template"]["spec"]["containers"][0]
        self.role = job["spec"]["template"]["metadata"]["labels"]["kdist.dev/role"]
        self.index = index
        self.command = list(container["command"])
        self.env = {e["name"]: e["value"] for e in container["env"]}
        self.env[k8s.INDEX_ENV] = str(index)  # what the Job controller sets


def pods(documents: list[dict]) -> list[Pod]:
    """Every pod the Indexed Jobs among `documents` would create."""
    return [Pod(job, index) for job in documents if job["kind"] == "Job"
            for index in range(job["spec"]["completions"])]


class PodLauncher(Launcher):
    """The launcher's state machine over pods, each run in its host's network namespace."""

    def __init__(self, spec: dict, all_pods: list[Pod], network: netlab.Network, namespace: str,
                 timeout: float | None = None, output: IO[str] | None = None):
        self.pods = {(pod.role, pod.index): pod for pod in all_pods}
        self.network, self.job, self.namespace = network, spec["name"], namespace
        roles: dict[str, list[str]] = {}
        for pod in all_pods:
            roles.setdefault(pod.role, []).append(f"{self._host(pod.role, pod.index)}:{spec['port']}")
        super().__init__(ClusterSpec(roles, source=spec["path"]), ["<per pod>"], timeout=timeout,
                         output=output)

    def _host(self, role: str, index: int) -> str:
        return k8s.host(self.job, role, index, self.namespace)

    def _check_addresses(self, spec: ClusterSpec) -> None:
        pass  # every address is a pod of the emulated network

    def _process_args(self, task_type: str, index: int) -> tuple[list[str], dict[str, str]]:
        pod = self.pods[(task_type, index)]
        command = pod.command
        if command[0] == "kdist" and shutil.which("kdist") is None:
            command = [sys.executable, "-m", "kdist", *command[1:]]
        env = dict(self.env, **pod.env, PYTHONUNBUFFERED="1")
        env.pop("TF_CONFIG", None)
        return self.network.exec_prefix(self._host(task_type, index)) + command, env


def simulate(spec: dict, command: list[str], namespace: str = "default",
             timeout: float | None = None, output: IO[str] | None = None) -> int:
    """Renders `spec` as Indexed Jobs running `command` and runs every pod; returns the exit code."""
    reason = netlab.unavailable_reason()
    if reason:
        raise ValueError(f"kdist k8s simulate: {reason}")
    documents = k8s.render(spec, command, namespace, image=spec.get("image") or "simulated",
                           fmt="jobs")
    all_pods = pods(documents)
    hosts = [k8s.host(spec["name"], pod.role, pod.index, namespace) for pod in all_pods]
    with netlab.Network(hosts) as network:
        return PodLauncher(spec, all_pods, network, namespace, timeout, output).run()
