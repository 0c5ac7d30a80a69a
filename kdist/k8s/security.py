"""What the rendered pods run as: by default, what the Pod Security Standards' `restricted`
profile admits, so namespaces that enforce it (common for tenants of managed clusters) take them.

Every pod: `runAsNonRoot`, a non-root user and group (the spec's ``run_as_user``, default 1000,
also the volumes' group), the runtime's default seccomp profile; every container: no privilege
escalation, every capability dropped. An image that must run as root says so in the spec
(``run_as_root: true``): its pods then keep everything but the non-root settings, which the
`baseline` profile admits and `restricted` does not, and carry an annotation that says why.

>>> from kdist.cluster.spec_file import KubernetesSpec
>>> spec = KubernetesSpec(path="job.yaml", name="job", roles={"worker": 2})
>>> pod_context(spec)["runAsNonRoot"], container_context(spec)["capabilities"]
(True, {'drop': ['ALL']})
"""

from __future__ import annotations

from kdist import envvars

ANNOTATION = "kdist.dev/pod-security"
SECRET_KEY = "job-secret"


def pod_context(spec) -> dict:
    """The pod's securityContext."""
    context = {"seccompProfile": {"type": "RuntimeDefault"}}
    if not spec.run_as_root:
        context = {"runAsNonRoot": True, "runAsUser": spec.run_as_user,
                   "runAsGroup": spec.run_as_user, "fsGroup": spec.run_as_user, **context}
    return context


def container_context(spec) -> dict:
    """Each container's securityContext."""
    context = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if not spec.run_as_root:
        context["runAsNonRoot"] = True
    return context


def annotations(spec) -> dict:
    """The pod template's annotations: why it is not `restricted`, when it is not."""
    if not spec.run_as_root:
        return {}
    return {ANNOTATION: f"baseline: {spec.path} sets run_as_root (the image runs as root), "
                        "which the restricted profile refuses"}


def harden(template: dict, spec) -> dict:
    """`template` (a pod template: metadata and spec) with kdist's security settings."""
    pod = template["spec"]
    pod["securityContext"] = pod_context(spec)
    for container in pod.get("containers", []):
        container["securityContext"] = container_context(spec)
    notes = annotations(spec)
    if notes:
        template.setdefault("metadata", {}).setdefault("annotations", {}).update(notes)
    return template


def secret_name(spec) -> str:
    """The Secret that holds the job's secret (proved by every member of kdist's TCP ring)."""
    return f"{spec.name}-kdist"


def create_secret_command(spec, namespace: str) -> str:
    """The command that creates the job's Secret once, with a random value, in `namespace`."""
    return (f"kubectl create secret generic {secret_name(spec)} --namespace {namespace} "
            f"--from-literal={SECRET_KEY}=\"$(openssl rand -hex 16)\"")


def ring_env(spec) -> list[dict]:
    """The environment of kdist's TCP ring: the job's secret, from its Secret, and the ring's
    port (the gRPC port plus one, which the NetworkPolicy admits from the job's pods)."""
    return [{"name": envvars.JOB_SECRET, "valueFrom": {"secretKeyRef": {
                "name": secret_name(spec), "key": SECRET_KEY}}},
            {"name": envvars.RING_PORT, "value": str(spec.port + 1)}]

