"""Every pod kdist renders passes the Pod Security Standards' `restricted` profile (Kubernetes
1.29 and newer: the rules as the PodSecurity admission controller checks them), for every preset
of cluster_specs/ in every format; `run_as_root: true` relaxes it to `baseline` and says why.

The checks below are written from the standard (kubernetes.io/docs/concepts/security/
pod-security-standards), apart from kdist's own settings (kdist/k8s/security.py)."""

import glob
import os

import pytest

from conftest import ROOT
from kdist.cluster.spec_file import read_k8s_spec
from kdist.k8s import render

PRESETS = sorted(glob.glob(os.path.join(ROOT, "cluster_specs", "*")))
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}


def baseline_violations(pod: dict) -> list[str]:
    found = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(f"{key} is true")
    containers = pod.get("containers", []) + pod.get("initContainers", []) + \
        pod.get("ephemeralContainers", [])
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            found.append(f"volume {volume.get('name')} is a hostPath")
    context = pod.get("securityContext", {})
    if context.get("windowsOptions", {}).get("hostProcess"):
        found.append("hostProcess")
    if context.get("seccompProfile", {}).get("type") == "Unconfined":
        found.append("the pod's seccomp profile is Unconfined")
    if context.get("sysctls"):
        found.append("sysctls are set")
    for container in containers:
        name = container.get("name")
        security = container.get("securityContext", {})
        if security.get("privileged"):
            found.append(f"{name} is privileged")
        added = set(security.get("capabilities", {}).get("add", []))
        if added - BASELINE_CAPABILITIES:
            found.append(f"{name} adds {sorted(added - BASELINE_CAPABILITIES)}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{name} uses a hostPort")
        if security.get("procMount", "Default") != "Default":
            found.append(f"{name} has procMount {security['procMount']}")
        if security.get("seccompProfile", {}).get("type") == "Unconfined":
            found.append(f"{name}'s seccomp profile is Unconfined")
    return found


def restricted_violations(pod: dict) -> list[str]:
    found = baseline_violations(pod)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume.get('name')} is {sorted(kinds)}")
    context = pod.get("securityContext", {})
    containers = pod.get("containers", []) + pod.get("initContainers", []) + \
        pod.get("ephemeralContainers", [])
    pod_seccomp = context.get("seccompProfile", {}).get("type")
    if context.get("runAsUser") == 0:
        found.append("the pod runs as user 0")
    for container in containers:
        name = container.get("name")
        security = container.get("securityContext", {})
        if security.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        non_root = security.get("runAsNonRoot", context.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if security.get("runAsUser") == 0:
            found.append(f"{name} runs as user 0")
        if security.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault",
                                                                               "Localhost"):
            found.append(f"{name}: no RuntimeDefault or Localhost seccomp profile")
        capabilities = security.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name} does not drop ALL capabilities")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name} adds capabilities beyond NET_BIND_SERVICE")
    return found


def pod_templates(value):
    """Every pod template (metadata and spec) in a rendered document."""
    if isinstance(value, dict):
        if "spec" in value and isinstance(value["spec"], dict) and "containers" in value["spec"]:
            yield value
        for child in value.values():
            yield from pod_templates(child)
    elif isinstance(value, list):
        for child in value:
            yield from pod_templates(child)


def rendered(spec_path: str, fmt: str) -> list[dict]:
    spec = read_k8s_spec(spec_path)
    try:
        return render.render(spec, ["python", "train.py"], image="registry/train:1", fmt=fmt)
    except ValueError:  # a format that refuses this preset's roles (trainjob: workers only)
        return []


CASES = [(os.path.basename(p), fmt) for p in PRESETS for fmt in render.FORMATS
         if rendered(p, fmt)]


def test_the_cases_cover_every_preset_and_format():
    assert {name for name, _ in CASES} == {os.path.basename(p) for p in PRESETS}
    assert {fmt for _, fmt in CASES} == set(render.FORMATS)
    assert sum(len(list(pod_templates(rendered(os.path.join(ROOT, "cluster_specs", n), f))))
               for n, f in CASES) >= 20


@pytest.mark.parametrize("name,fmt", CASES)
def test_every_rendered_pod_passes_the_restricted_profile(name, fmt):
    templates = list(pod_templates(rendered(os.path.join(ROOT, "cluster_specs", name), fmt)))
    assert templates
    for template in templates:
        assert restricted_violations(template["spec"]) == [], template
        assert "kdist.dev/pod-security" not in template.get("metadata", {}).get("annotations", {})


def test_run_as_root_relaxes_to_baseline_and_says_why(tmp_path):
    spec = tmp_path / "root.yaml"
    spec.write_text("name: rooted\nroles: {worker: 2}\nrun_as_root: true\n")
    for fmt in render.FORMATS:
        for template in pod_templates(rendered(str(spec), fmt)):
            assert baseline_violations(template["spec"]) == []
            assert any("runAsNonRoot" in v for v in restricted_violations(template["spec"]))
            note = template["metadata"]["annotations"]["kdist.dev/pod-security"]
            assert note.startswith("baseline:") and "run_as_root" in note


def test_the_checker_finds_what_restricted_refuses():
    """Each rule of the checker fails a pod that breaks it."""
    good = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
    assert restricted_violations(good) == []
    import copy

    for change, words in [
        (lambda p: p["securityContext"].pop("runAsNonRoot"), "runAsNonRoot"),
        (lambda p: p["securityContext"].pop("seccompProfile"), "seccomp"),
        (lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
         "allowPrivilegeEscalation"),
        (lambda p: p["containers"][0]["securityContext"]["capabilities"].update(drop=[]),
         "drop ALL"),
        (lambda p: p.update(hostNetwork=True), "hostNetwork"),
        (lambda p: p.update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "hostPath"),
        (lambda p: p["securityContext"].update(runAsUser=0), "user 0"),
    ]:
        pod = copy.deepcopy(good)
        change(pod)
        assert any(words in v for v in restricted_violations(pod)), words


@pytest.mark.parametrize("content,words", [
    ("run_as_user: 0", "run_as_user: 0 is not a non-root user id"),
    ("run_as_user: -5", "run_as_user: -5 is not a non-root user id"),
    ("run_as_root: yes please", "run_as_root: 'yes please' is not true or false"),
])
def test_bad_security_keys_name_the_field(tmp_path, content, words):
    from kdist import ClusterSpecError

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: x\nroles: {{worker: 1}}\n{content}\n")
    with pytest.raises(ClusterSpecError, match=words):
        read_k8s_spec(str(spec))
