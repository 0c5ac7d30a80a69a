"""Every pod template kdist renders, finished the same way: kdist's security settings
(`kdist.k8s.security`), then the spec's pod keys (`kdist.cluster.pod_keys`): volumes and their
mounts, node selector, tolerations, extra environment, image pull secrets, service account."""

from __future__ import annotations

from kdist.k8s import security


def finish(template: dict, spec) -> dict:
    """`template` (a pod template: metadata and spec) hardened, with the spec's pod keys."""
    security.harden(template, spec)
    pod = template["spec"]
    keys = spec.pod_keys
    if keys.get("volumes"):
        pod["volumes"] = [{"name": v["name"], "persistentVolumeClaim": {
            "claimName": v["claim"], **({"readOnly": True} if v.get("read_only") else {})}}
            for v in keys["volumes"]]
    if keys.get("node_selector"):
        pod["nodeSelector"] = dict(keys["node_selector"])
    if keys.get("tolerations"):
        pod["tolerations"] = [dict(t) for t in keys["tolerations"]]
    if keys.get("image_pull_secrets"):
        pod["imagePullSecrets"] = [{"name": n} for n in keys["image_pull_secrets"]]
    if keys.get("service_account"):
        pod["serviceAccountName"] = keys["service_account"]
    for container in pod.get("containers", []):
        if keys.get("env"):
            container["env"] = [*container.get("env", []),
                                *({"name": k, "value": v} for k, v in keys["env"].items())]
        if keys.get("volumes"):
            container["volumeMounts"] = [
                {"name": v["name"], "mountPath": v["mount"],
                 **({"readOnly": True} if v.get("read_only") else {})} for v in keys["volumes"]]
    return template
