"""Kubernetes manifests from cluster specs: offline schema validation, per-pod TF_CONFIG, errors."""

import dataclasses
import json
import os
import subprocess
import re
import sys

import kubernetes_validate
import pytest
import yaml

from conftest import run_kdist, simulate_mnist_pods
from kdist import ClusterSpecError
from kdist.k8s import netlab, pod
from kdist.cluster.spec_file import read_k8s_spec

PRESETS = ["cluster_specs/k8s-mwms.yaml", "cluster_specs/k8s-ps.yaml"]
# The oldest Kubernetes minor kdist supports (docs/kubernetes.md) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.33.0", kubernetes_validate.latest_version())


def rendered(path, fmt="jobs", namespace="ml"):
    result = run_kdist(["k8s", "render", "--spec", path, "--image", "registry/train:1",
                        "--namespace", namespace, "--format", fmt], timeout=60)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


@pytest.mark.parametrize("path", PRESETS)
def test_jobs_manifests_validate_against_the_kubernetes_schemas(path):
    documents = rendered(path)
    assert [d["kind"] for d in documents][:1] == ["Service"]
    assert {d["kind"] for d in documents} == {"Service", "Job", "NetworkPolicy"}
    for document in documents:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)


# The clusters the presets imply in namespace "ml", written out by hand (not computed by kdist).
MWMS_CLUSTER = {"worker": ["mnist-mwms-worker-0.mnist-mwms.ml.svc:2222",
                           "mnist-mwms-worker-1.mnist-mwms.ml.svc:2222"]}
PS_CLUSTER = {"chief": ["mnist-ps-chief-0.mnist-ps.ml.svc:2222"],
              "worker": ["mnist-ps-worker-0.mnist-ps.ml.svc:2222",
                         "mnist-ps-worker-1.mnist-ps.ml.svc:2222"],
              "ps": ["mnist-ps-ps-0.mnist-ps.ml.svc:2222", "mnist-ps-ps-1.mnist-ps.ml.svc:2222"]}
EXPECTED_CLUSTERS = {"cluster_specs/k8s-mwms.yaml": MWMS_CLUSTER,
                     "cluster_specs/k8s-ps.yaml": PS_CLUSTER}


@pytest.mark.parametrize("path", PRESETS)
def test_each_pod_computes_the_tf_config_the_spec_implies(path):
    spec = read_k8s_spec(path)
    expected_cluster = EXPECTED_CLUSTERS[path]
    for job in (d for d in rendered(path) if d["kind"] == "Job"):
        role = job["metadata"]["name"].rsplit("-", 1)[1]
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert container["command"][:3] == ["kdist", "exec", "--"]
        assert job["spec"]["completions"] == spec.roles[role]
        for index in range(job["spec"]["completions"]):
            tf_config = json.loads(pod.tf_config({**env, "JOB_COMPLETION_INDEX": str(index)}))
            assert tf_config == {"cluster": expected_cluster,
                                 "task": {"type": role, "index": index}}


def test_kdist_exec_sets_tf_config_and_runs_the_command():
    job = next(d for d in rendered("cluster_specs/k8s-ps.yaml")
               if d["kind"] == "Job" and d["metadata"]["name"] == "mnist-ps-ps")
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
           if "value" in e}
    result = run_kdist(["exec", "--", sys.executable, "-c",
                        "import os; print(os.environ['TF_CONFIG'])"], timeout=60,
                       env={**env, "JOB_COMPLETION_INDEX": "1"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"cluster": PS_CLUSTER, "task": {"type": "ps", "index": 1}}
    tf_config = run_kdist(["tf-config", "--spec", "cluster_specs/k8s-ps.yaml", "--task", "ps:1",
                           "--namespace", "ml"], timeout=60)
    assert json.loads(tf_config.stdout) == {"cluster": PS_CLUSTER,
                                            "task": {"type": "ps", "index": 1}}
    # the names come from Kubernetes: said on stderr, with what to do on other machines
    assert "lists roles, not addresses: these are the pods' names" in tf_config.stderr
    assert "pass --host-pattern" in tf_config.stderr and "kdist launch --spec" in tf_config.stderr


def test_network_policy_admits_grpc_and_the_ring_only_from_the_jobs_own_pods():
    policy = next(d for d in rendered("cluster_specs/k8s-mwms.yaml") if d["kind"] == "NetworkPolicy")
    selector = {"matchLabels": {"kdist.dev/job": "mnist-mwms"}}
    assert policy["spec"]["podSelector"] == selector
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": selector}],
                                          "ports": [{"protocol": "TCP", "port": 2222},
                                                    {"protocol": "TCP", "port": 2223}]}]


@pytest.mark.parametrize("path", PRESETS)
def test_tfjob_uses_chief_never_master_and_a_tensorflow_container(path):
    tfjob, policy = rendered(path, fmt="tfjob")
    assert tfjob["apiVersion"] == "kubeflow.org/v1" and tfjob["kind"] == "TFJob"
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    assert "Master" not in replicas and set(replicas) <= {"Chief", "Worker", "PS", "Evaluator"}
    for replica in replicas.values():
        assert replica["template"]["spec"]["containers"][0]["name"] == "tensorflow"
        assert replica["restartPolicy"] == "Never"
    kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("content,field,words", [
    ("name: x\nroles: {trainer: 2}\n", "roles.trainer", "unknown job"),
    ("name: x\nroles: {chief: 2, worker: 1}\n", "roles.chief", "at most one"),
    ("name: x\nroles: {worker: 1, ps: 1}\n", "cluster.chief", "needs a chief"),
    ("name: Bad_Name\nroles: {worker: 2}\n", "name", "not a Kubernetes name"),
    ("name: x\nroles: {worker: 2}\nrestart_policy: Always\n", "restart_policy", "Never or OnFailure"),
    ("name: x\nroles: {worker: {count: 2, cpu: 1}}\n", "roles.worker.cpu", "unknown key"),
    ("name: x\ncluster: {worker: ['h:1']}\n", "cluster", "cannot be rendered"),
])
def test_bad_specs_name_the_field(tmp_path, content, field, words):
    path = tmp_path / "spec.yaml"
    path.write_text(content)
    with pytest.raises(ClusterSpecError) as info:
        read_k8s_spec(str(path))
    assert info.value.field.endswith(field) and words in str(info.value)


def test_missing_image_is_a_clear_error():
    result = run_kdist(["k8s", "render", "--spec", "cluster_specs/k8s-mwms.yaml"], timeout=60)
    assert result.returncode == 2 and "Kubernetes needs a container image" in result.stderr


def test_evaluator_pod_gets_the_training_cluster_and_its_own_task(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("name: ev\nroles: {chief: 1, worker: 2, evaluator: 1}\ncommand: [python, t.py]\n")
    documents = rendered(str(path))
    jobs = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Job"}
    assert set(jobs) == {"ev-chief", "ev-worker", "ev-evaluator"}
    for document in documents:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)
    env = {e["name"]: e["value"]
           for e in jobs["ev-evaluator"]["spec"]["template"]["spec"]["containers"][0]["env"]
           if "value" in e}
    tf_config = json.loads(pod.tf_config({**env, "JOB_COMPLETION_INDEX": "0"}))
    assert tf_config["task"] == {"type": "evaluator", "index": 0}
    assert set(tf_config["cluster"]) == {"chief", "worker"}  # nobody connects to the evaluator
    tfjob = rendered(str(path), fmt="tfjob")[0]
    assert tfjob["spec"]["tfReplicaSpecs"]["Evaluator"]["replicas"] == 1


def test_tf_config_host_pattern_names_every_task(tmp_path):
    result = run_kdist(["tf-config", "--spec", "cluster_specs/k8s-ps.yaml", "--task", "worker:1",
                        "--host-pattern", "{role}{index}.lab.example"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["cluster"] == {
        "chief": ["chief0.lab.example:2222"], "ps": ["ps0.lab.example:2222", "ps1.lab.example:2222"],
        "worker": ["worker0.lab.example:2222", "worker1.lab.example:2222"]}
    for pattern, words in [("{role}-{index}-{rank}.lab", "{rank} in"), ("node.lab", "lacks {role}")]:
        result = run_kdist(["tf-config", "--spec", "cluster_specs/k8s-ps.yaml", "--task", "ps:0",
                            "--host-pattern", pattern], timeout=60)
        assert result.returncode == 2 and "--host-pattern" in result.stderr and words in result.stderr


def test_rendered_mwms_pods_train_as_separate_hosts_resolving_service_dns_names(netns):
    """`kdist k8s simulate`: each pod in its own network namespace and address, /etc/hosts for the
    Service DNS names, the pod's own command and env -> MWMS training completes."""
    assert ("started 2 task(s): worker-0=mnist-mwms-worker-0.mnist-mwms.default.svc:2222, "
            "worker-1=mnist-mwms-worker-1.mnist-mwms.default.svc:2222") in simulate_mnist_pods()


def test_network_namespaces_resolve_each_other_and_carry_traffic(netns):
    server = "import socket; s = socket.create_server(('', 7777)); c, _ = s.accept(); " \
             "c.sendall(socket.gethostbyname('a.test').encode())"
    # The client retries until the server listens (a busy machine may take seconds to start it).
    client = "import socket, time\ndeadline = time.monotonic() + 20\nwhile True:\n    try:\n" \
             "        c = socket.create_connection(('b.test', 7777), timeout=5)\n        break\n" \
             "    except ConnectionRefusedError:\n        if time.monotonic() > deadline:\n" \
             "            raise\n        time.sleep(0.1)\nprint(c.recv(64).decode())"
    with netlab.Network(["a.test", "b.test"]) as network:
        serving = subprocess.Popen(network.exec_prefix("b.test") + [sys.executable, "-c", server])
        try:
            out = subprocess.run(network.exec_prefix("a.test") + [sys.executable, "-c", client],
                                 capture_output=True, text=True, timeout=30)
        finally:
            serving.kill()
            serving.wait()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == network.addresses["a.test"] == "10.213.0.1"


def test_a_killed_runs_namespaces_are_swept_and_a_live_ones_kept(netns):
    # A run killed before its Network closed leaves kd<pid>* namespaces behind; the next run's
    # tests must not fail on them (they failed CI once), and a running network must be kept.
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    stale, live = f"kd{ended.pid}h0", f"kd{os.getpid()}h9"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert netlab.remove_stale() == [stale]
        assert stale not in netlab.namespaces() and live in netlab.namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", live])
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True)


def test_evicted_and_preempted_pods_do_not_spend_the_backoff_limit():
    for job in (d for d in rendered("cluster_specs/k8s-mwms.yaml") if d["kind"] == "Job"):
        rules = job["spec"]["podFailurePolicy"]["rules"]
        assert {"action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
        assert {"action": "Ignore", "onExitCodes": {"containerName": "tensorflow",
                                                    "operator": "In", "values": [75]}} in rules
        assert {"action": "FailJob", "onExitCodes": {"containerName": "tensorflow",  # no restart
                                                     "operator": "In", "values": [2, 126, 127]}} \
            in rules  # can fix a usage error or a missing program
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_render_writes_the_output_file_with_the_command_after_dashes_and_the_specs_image(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: demo\nroles: {worker: 2}\nimage: registry/demo:7\n")
    output = tmp_path / "out.yaml"
    result = run_kdist(["k8s", "render", "--spec", str(spec), "--output", str(output), "--",
                        "python", "train.py", "--epochs", "2"], timeout=60)
    assert result.returncode == 0 and result.stdout == "", result.stderr
    documents = list(yaml.safe_load_all(output.read_text()))
    job = next(d for d in documents if d["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry/demo:7"
    assert container["command"] == ["kdist", "exec", "--", "python", "train.py", "--epochs", "2"]


def test_simulate_in_another_namespace_stops_at_its_timeout_with_124(netns):
    result = run_kdist(["k8s", "simulate", "--spec", "cluster_specs/k8s-mwms.yaml", "--namespace",
                        "team-a", "--timeout", "3", "--", sys.executable, "-c",
                        "import os, time; print(os.environ['KDIST_CLUSTER']); time.sleep(60)"],
                       timeout=90)
    assert result.returncode == 124, result.stdout[-2000:] + result.stderr[-2000:]
    assert "mnist-mwms-worker-1.mnist-mwms.team-a.svc:2222" in result.stdout
    assert re.search(r"timed out after \d+s", result.stdout)  # 3s, scaled by the suite


# ------------------------------------------------------------------ pod keys (issue 46)
def test_the_gpu_preset_puts_its_pod_keys_in_every_pod_of_every_format():
    """cluster_specs/k8s-gpu.yaml: volumes (mounted in the container), node selector, tolerations,
    env, image pull secrets and service account reach every pod template kdist renders, and the
    documents pass the Kubernetes schemas."""
    from kdist.k8s import render
    from test_pod_security import pod_templates

    spec = read_k8s_spec("cluster_specs/k8s-gpu.yaml")
    for fmt in ("jobs", "tfjob", "jobset"):
        documents = render.render(spec, ["python", "train.py"], fmt=fmt)
        templates = list(pod_templates(documents))
        assert templates, fmt
        for template in templates:
            pod_spec = template["spec"]
            assert pod_spec["volumes"] == [
                {"name": "backups", "persistentVolumeClaim": {"claimName": "shared-backups"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet",
                                                          "readOnly": True}}], fmt
            assert pod_spec["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
            assert pod_spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                "effect": "NoSchedule"}]
            assert pod_spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
            assert pod_spec["serviceAccountName"] == "trainer"
            container = pod_spec["containers"][0]
            assert {"name": "DATA_DIR", "value": "/data"} in container["env"]
            assert container["volumeMounts"][0] == {"name": "backups", "mountPath": "/backups"}
            assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
        if fmt == "jobs":
            for document in documents:
                kubernetes_validate.validate(document, KUBERNETES_VERSIONS[-1], strict=True)
    # A TrainJob's pod template is the TrainingRuntime jobs share: env goes to the TrainJob, the
    # keys that place pods are refused with the way out.
    with pytest.raises(ClusterSpecError, match=r"k8s-gpu.yaml.image_pull_secrets: goes into the "
                                               r"pod template.*Fix: use --format jobset"):
        render.render(spec, ["python", "train.py"], fmt="trainjob")
    only_env = dataclasses.replace(spec, pod_keys={"env": {"DATA_DIR": "/data"}})
    runtime, train_job = render.render(only_env, ["python", "train.py"], fmt="trainjob")[0:2]
    assert {"name": "DATA_DIR", "value": "/data"} in train_job["spec"]["trainer"]["env"]
    assert "DATA_DIR" not in json.dumps(runtime)


@pytest.mark.parametrize("content,words", [
    ("volumes: {name: a}", "k8s.yaml.volumes: must be a list"),
    ("volumes: [{name: a, claim: b}]", "k8s.yaml.volumes[0].mount: None is not an absolute path"),
    ("volumes: [{name: a, claim: b, mount: /x, size: 1}]", "k8s.yaml.volumes[0].size: unknown key"),
    ("volumes: [{name: A, claim: b, mount: /x}]", "k8s.yaml.volumes[0].name: 'A' is not a Kubernetes"),
    ("volumes: [{name: a, claim: b, mount: /x}, {name: c, claim: d, mount: /x}]",
     "a second volume named 'c' or mounted at '/x'"),
    ("node_selector: [gpu]", "k8s.yaml.node_selector: must be a mapping"),
    ("tolerations: [{key: gpu, operator: Maybe}]", "k8s.yaml.tolerations[0].operator: 'Maybe'"),
    ("env: {TF_CONFIG: x}", "k8s.yaml.env.TF_CONFIG: is set by kdist in every pod"),
    ("env: {DATA_DIR: 3}", "k8s.yaml.env.DATA_DIR: 3 is not a string"),
    ("env: {1X: a}", "k8s.yaml.env.1X: is not an environment variable name"),
    ("image_pull_secrets: regcred", "k8s.yaml.image_pull_secrets: must be a list of Secret names"),
    ("service_account: Trainer", "k8s.yaml.service_account: 'Trainer' is not a service account"),
    ("node_selectr: {a: b}", "k8s.yaml.node_selectr: unknown key"),
])
def test_bad_pod_keys_name_the_field_and_the_fix(tmp_path, content, words):
    path = tmp_path / "k8s.yaml"
    path.write_text(f"name: demo\nroles: {{worker: 2}}\nimage: i:1\n{content}\n")
    with pytest.raises(ClusterSpecError) as error:
        read_k8s_spec(str(path))
    assert words in str(error.value) and ". Fix: " in str(error.value)


def test_renders_of_the_same_inputs_are_identical_and_say_how_to_create_the_secret():
    """No Secret in the rendered files (so they can be committed and diffed); the pods read it
    by name, and the command that creates it once is printed on stderr."""
    runs = [run_kdist(["k8s", "render", "--spec", "cluster_specs/k8s-mwms.yaml", "--namespace",
                       "ml", "--image", "registry/train:1"], timeout=60) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    assert "kind: Secret" not in runs[0].stdout and "secretKeyRef" in runs[0].stdout
    assert "kubectl create secret generic mnist-mwms-kdist --namespace ml " \
        "--from-literal=job-secret=" in runs[0].stderr
