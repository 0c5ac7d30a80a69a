"""JobSet and Kubeflow Trainer v2 manifests: strict validation with kubeflow-trainer-api's models,
the TF_CONFIG each pod derives from what JobSet gives it, failure rules, and a rehearsal."""

import json
import sys

import kubernetes_validate
import pytest
import yaml

from conftest import run_kdist, simulate_mnist_pods
from fixtures import trainer_models
from kdist import ClusterSpecError
from kdist.cluster.spec_file import read_k8s_spec
from kdist.k8s import pod, render, simulate

PRESETS = ["cluster_specs/k8s-mwms.yaml", "cluster_specs/k8s-ps.yaml"]
# Written out by hand: JobSet names pod i of replicated job R (one Job) <set>-<R>-0-<i>, under the
# subdomain <set> (JobSet's headless Service).
JOBSET_CLUSTERS = {
    "cluster_specs/k8s-mwms.yaml": {"worker": ["mnist-mwms-worker-0-0.mnist-mwms.ml.svc:2222",
                                               "mnist-mwms-worker-0-1.mnist-mwms.ml.svc:2222"]},
    "cluster_specs/k8s-ps.yaml": {"chief": ["mnist-ps-chief-0-0.mnist-ps.ml.svc:2222"],
                                  "worker": ["mnist-ps-worker-0-0.mnist-ps.ml.svc:2222",
                                             "mnist-ps-worker-0-1.mnist-ps.ml.svc:2222"],
                                  "ps": ["mnist-ps-ps-0-0.mnist-ps.ml.svc:2222",
                                         "mnist-ps-ps-0-1.mnist-ps.ml.svc:2222"]}}


def rendered(path, fmt, namespace="ml"):
    result = run_kdist(["k8s", "render", "--spec", path, "--image", "registry/train:1",
                        "--namespace", namespace, "--format", fmt, "--", "python", "train.py"],
                       timeout=60)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def job_templates(document):
    """(replicated job name, Job template) of a JobSet or a TrainingRuntime."""
    spec = document["spec"] if document["kind"] == "JobSet" else document["spec"]["template"]["spec"]
    return [(r["name"], r["template"]) for r in spec["replicatedJobs"]]


@pytest.mark.parametrize("path,fmt", [(PRESETS[0], "jobset"), (PRESETS[1], "jobset"),
                                      (PRESETS[0], "trainjob")])
def test_manifests_validate_strictly(path, fmt):
    """Against kubeflow-trainer-api's JobSet/TrainJob/TrainingRuntime models, unknown fields
    included; each Job template inside, and the NetworkPolicy, against the Kubernetes schemas."""
    documents = rendered(path, fmt)
    kinds = [d["kind"] for d in documents]
    assert kinds == (["JobSet"] if fmt == "jobset" else
                     ["TrainingRuntime", "TrainJob"]) + ["NetworkPolicy"]
    for document in documents[:-1]:
        trainer_models.validate(document)
        for _, template in (job_templates(document) if document["kind"] != "TrainJob" else []):
            job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, **template}
            kubernetes_validate.validate(job, "1.29.0", strict=True)
            kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    kubernetes_validate.validate(documents[-1], kubernetes_validate.latest_version(), strict=True)


def test_the_strict_check_names_a_misspelt_field():
    document = rendered(PRESETS[1], "jobset")[0]
    document["spec"]["failurePolicy"]["maxRestart"] = 3
    document["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0][
        "envFrom2"] = []
    with pytest.raises(AssertionError) as raised:
        trainer_models.validate(document)
    assert "JobSet.spec.failurePolicy.maxRestart" in str(raised.value)
    assert "replicatedJobs[1].template.spec.template.spec.containers[0].envFrom2" in str(raised.value)


@pytest.mark.parametrize("path", PRESETS)
def test_each_jobset_pod_derives_the_cluster_from_jobsets_labels(path):
    """No TF_CONFIG and no cluster JSON in the YAML: role counts, port, and the downward API."""
    documents = rendered(path, "jobset")
    text = yaml.safe_dump_all(documents)
    assert "TF_CONFIG" not in text and "svc:2222" not in text
    pods = simulate.pods(documents, "ml")
    spec = read_k8s_spec(path)
    assert sorted((p.role, p.index) for p in pods) == sorted(
        (role, i) for role, n in spec.roles.items() for i in range(n))
    for p in pods:
        assert p.command == ["kdist", "exec", "--", "python", "train.py"]
        assert json.loads(pod.tf_config(p.env)) == {"cluster": JOBSET_CLUSTERS[path],
                                                    "task": {"type": p.role, "index": p.index}}
        assert f"{p.host}:2222" == JOBSET_CLUSTERS[path][p.role][p.index]


def test_jobset_succeeds_with_the_chief_and_restarts_the_whole_set_on_failure(tmp_path):
    ps_set = rendered(PRESETS[1], "jobset")[0]["spec"]
    assert ps_set["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: demo\nroles: {worker: 3}\nbackoff_limit: 4\n")
    mwms_set = rendered(str(spec_file), "jobset")[0]["spec"]
    assert mwms_set["successPolicy"]["targetReplicatedJobs"] == ["worker"]
    assert mwms_set["failurePolicy"] == {"maxRestarts": 4, "rules": [
        {"name": "NotRestartable", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]}
    for _, template in job_templates({"kind": "JobSet", "spec": mwms_set}):
        assert template["spec"]["backoffLimit"] == 0
        rules = template["spec"]["podFailurePolicy"]["rules"]
        assert [r["action"] for r in rules] == ["Ignore", "Ignore", "FailJob"]
        assert rules[1]["onExitCodes"]["values"] == [75]
        assert rules[2]["onExitCodes"]["values"] == [2, 126, 127]


def test_trainjob_runs_the_command_on_num_nodes_workers_of_kdists_runtime():
    runtime, train_job, policy = rendered(PRESETS[0], "trainjob")
    assert train_job["spec"]["runtimeRef"] == {"name": "kdist-tensorflow", "kind": "TrainingRuntime",
                                               "apiGroup": "trainer.kubeflow.org"}
    trainer = train_job["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["args"] == ["python", "train.py"]
    assert runtime["metadata"]["name"] == "kdist-tensorflow"
    [(name, template)] = job_templates(runtime)
    assert name == "node" and template["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    container = template["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "node" and container["command"] == ["kdist", "exec", "--"]
    # What the Trainer does: the JobSet is named after the TrainJob, the TrainJob's env is merged
    # into the node container's, numNodes pods; JobSet sets the labels.
    fields = {path: value for path, value in (
        ("metadata.labels['jobset.sigs.k8s.io/jobset-name']", "mnist-mwms"),
        ("metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']", "node"),
        ("metadata.labels['jobset.sigs.k8s.io/job-index']", "0"), ("metadata.namespace", "ml"))}
    env = {e["name"]: fields[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in container["env"]}
    env.update({e["name"]: e["value"] for e in trainer["env"] if "value" in e})
    assert {"name": "KDIST_JOB_SECRET", "valueFrom": {"secretKeyRef": {
        "name": "mnist-mwms-kdist", "key": "job-secret"}}} in trainer["env"]
    for index in range(2):
        tf_config = json.loads(pod.tf_config({**env, "JOB_COMPLETION_INDEX": str(index)}))
        assert tf_config == {"cluster": {"worker": [
            "mnist-mwms-node-0-0.mnist-mwms.ml.svc:2222", "mnist-mwms-node-0-1.mnist-mwms.ml.svc:2222"]},
            "task": {"type": "worker", "index": index}}
    assert policy["spec"]["podSelector"] == {"matchLabels": {"jobset.sigs.k8s.io/jobset-name":
                                                             "mnist-mwms"}}


def test_trainjob_refuses_a_chief_or_ps_layout():
    with pytest.raises(ClusterSpecError) as raised:
        render.render(read_k8s_spec(PRESETS[1]), ["python", "t.py"], "ml", "img", "trainjob")
    assert raised.value.field == "cluster_specs/k8s-ps.yaml.roles"
    assert "chief, ps" in str(raised.value) and "--format jobset" in str(raised.value)


@pytest.mark.parametrize("change,field,words", [
    ({"KDIST_JOB_INDEX": "1"}, "KDIST_JOB_INDEX", "replicas: 1"),
    ({"KDIST_ROLES": "worker"}, "KDIST_ROLES", "job=count"),
    ({"KDIST_REPLICATED_JOB": "trainer"}, "KDIST_REPLICATED_JOB", "not a TF role"),
    ({"KDIST_JOBSET": None}, "KDIST_JOBSET", "not set"),
])
def test_kdist_exec_names_the_pod_field_it_cannot_use(change, field, words):
    env = {"KDIST_ROLES": "worker=2", "KDIST_PORT": "2222", "KDIST_JOBSET": "demo",
           "KDIST_REPLICATED_JOB": "worker", "KDIST_JOB_INDEX": "0", "KDIST_NAMESPACE": "ml",
           "JOB_COMPLETION_INDEX": "1"}
    env.update(change)
    env = {k: v for k, v in env.items() if v is not None}
    result = run_kdist(["exec", "--", sys.executable, "-c", "print('ran')"], timeout=60, env=env)
    assert result.returncode == 2 and "ran" not in result.stdout, result.stdout
    assert field in result.stderr and words in result.stderr, result.stderr


def test_rendered_jobset_pods_train_as_separate_hosts(netns):
    """`kdist k8s simulate --format jobset`: every pod in its own network namespace, reached by the
    DNS name JobSet gives it, its TF_CONFIG derived from the (emulated) downward API."""
    assert ("started 2 task(s): worker-0=mnist-mwms-worker-0-0.mnist-mwms.ml.svc:2222, "
            "worker-1=mnist-mwms-worker-0-1.mnist-mwms.ml.svc:2222") in \
        simulate_mnist_pods("--format", "jobset", "--namespace", "ml")

