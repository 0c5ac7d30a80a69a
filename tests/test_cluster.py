"""The cluster model: TF_CONFIG parsing, validation messages, rendering, spec files."""

import json

import pytest

from kdist import ClusterSpec, ClusterSpecError, cluster
from kdist.cluster.spec_file import load_spec

W2 = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}

BAD_TF_CONFIGS = [
    # (TF_CONFIG text, field named in the error, words the fix must contain)
    ('{"cluster": {"worker": ["a:1"]', "TF_CONFIG", "not valid JSON"),
    ('["worker"]', "TF_CONFIG", "must be a JSON object"),
    (json.dumps({"cluster": W2}), "TF_CONFIG.task", "missing"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "TF_CONFIG.cluster", "missing"),
    (json.dumps({"cluster": {"master": ["h:1"], "worker": ["h:2"]},
                 "task": {"type": "worker", "index": 0}}), "TF_CONFIG.cluster.master", "'chief'"),
    (json.dumps({"cluster": {"trainer": ["h:1"]}, "task": {"type": "trainer", "index": 0}}),
     "TF_CONFIG.cluster.trainer", "unknown job"),
    (json.dumps({"cluster": W2, "task": {"type": "worker", "index": 2}}), "TF_CONFIG.task.index",
     "from 0 to 1"),
    (json.dumps({"cluster": W2, "task": {"type": "worker", "index": -1}}), "TF_CONFIG.task.index",
     "non-negative"),
    (json.dumps({"cluster": W2, "task": {"type": "worker", "index": "0"}}), "TF_CONFIG.task.index",
     "non-negative"),
    (json.dumps({"cluster": W2, "task": {"index": 0}}), "TF_CONFIG.task.type", "missing"),
    (json.dumps({"cluster": W2, "task": {"type": "chief", "index": 0}}), "TF_CONFIG.task.type",
     "not in the cluster"),
    (json.dumps({"cluster": W2, "task": {"type": "master", "index": 0}}),
     "TF_CONFIG.task.type", "'chief'"),
    (json.dumps({"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG.cluster.worker[1]", "also used by TF_CONFIG.cluster.worker[0]"),
    (json.dumps({"cluster": {"chief": ["h:1", "h:2"], "worker": ["h:3"]},
                 "task": {"type": "worker", "index": 0}}), "TF_CONFIG.cluster.chief",
     "at most one"),
    (json.dumps({"cluster": {"evaluator": ["h:1", "h:2"], "worker": ["h:3"]},
                 "task": {"type": "worker", "index": 0}}), "TF_CONFIG.cluster.evaluator",
     "at most one"),
    (json.dumps({"cluster": {"chief": ["h:1"], "ps": ["h:2"]}, "task": {"type": "chief", "index": 0}}),
     "TF_CONFIG.cluster.worker", "needs a worker"),
    (json.dumps({"cluster": {"worker": ["h:1"], "ps": ["h:2"]}, "task": {"type": "ps", "index": 0}}),
     "TF_CONFIG.cluster.chief", "needs a chief"),
    (json.dumps({"cluster": {"worker": [""]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG.cluster.worker[0]", "empty"),
    (json.dumps({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG.cluster", "missing or empty while a task is given"),
    (json.dumps({"cluster": {"worker": [], "ps": ["h:1"]}, "task": {"type": "ps", "index": 0}}),
     "TF_CONFIG.cluster.worker", "needs a worker"),  # an empty job is no job, as for TF
    (json.dumps({"cluster": {"worker": ["h:0"]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG.cluster.worker[0]", "bad port"),
    (json.dumps({"cluster": {"worker": ["h:70000"]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG.cluster.worker[0]", "bad port"),
    (json.dumps({"cluster": {"worker": ["h:http"]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG.cluster.worker[0]", "bad port"),
    (json.dumps({"cluster": {"worker": ["hostonly"]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG.cluster.worker[0]", "no host or no port"),
    (json.dumps({"cluster": W2, "task": {"type": "worker", "index": 0, "tasks": 1}}),
     "TF_CONFIG.task.tasks", "unknown key"),
    (json.dumps({"cluster": W2, "task": {"type": "worker", "index": 0}, "environment": 3}),
     "TF_CONFIG.environment", "must be a string"),
    (json.dumps({"cluster": W2, "task": {"type": "worker", "index": 0}, "rpc_layer": "grpc+verbs"}),
     "TF_CONFIG.rpc_layer", "not supported"),
    (json.dumps({"cluster": W2, "task": {"type": "evaluator", "index": 1}}), "TF_CONFIG.task.index",
     "one evaluator"),
]


@pytest.mark.parametrize("text,field,words", BAD_TF_CONFIGS)
def test_bad_tf_config_names_field_and_fix(text, field, words):
    with pytest.raises(ClusterSpecError) as info:
        ClusterSpec.from_tf_config(text)
    assert info.value.field == field
    assert words in str(info.value)
    assert "Fix:" in str(info.value)


def test_cluster_reads_tf_config_from_environment(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["127.0.0.1:1"], **W2},
                                                "task": {"type": "worker", "index": 1}}))
    spec = cluster()
    assert (spec.task_type, spec.task_index, spec.task) == ("worker", 1, "worker:1")
    assert spec.roles == {"chief": 1, "worker": 2}
    assert spec.num_workers == 3 and not spec.is_chief and spec.leader == ("chief", 0)
    assert spec.with_task("chief", 0).is_chief


def test_no_tf_config_is_a_single_chief_process(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    spec = cluster()
    assert not spec.is_distributed and spec.is_chief and spec.num_workers == 1 and spec.task is None


def test_worker_zero_is_chief_without_chief_job():
    spec = ClusterSpec(W2, "worker", 0)
    assert spec.is_chief and spec.leader == ("worker", 0)
    assert not spec.with_task("worker", 1).is_chief


def test_evaluator_may_stand_outside_the_cluster():
    spec = ClusterSpec.from_tf_config({"cluster": W2, "task": {"type": "evaluator", "index": 0}})
    assert spec.task == "evaluator:0" and not spec.is_chief


def test_tf_config_round_trips_for_every_task():
    spec = ClusterSpec({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]})
    for task_type, index in spec.tasks():
        parsed = ClusterSpec.from_tf_config(spec.tf_config_json(task_type, index))
        assert parsed == spec.with_task(task_type, index)
    assert spec.tasks() == [("chief", 0), ("worker", 0), ("ps", 0)]


def test_resolver_is_tensorflows_own(monkeypatch):
    import tensorflow as tf

    config = {"cluster": W2, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    resolver = cluster().resolver()
    assert isinstance(resolver, tf.distribute.cluster_resolver.TFConfigClusterResolver)
    assert resolver.cluster_spec().as_dict() == W2 and resolver.task_id == 1
    in_code = ClusterSpec(W2, "worker", 1, source="code").resolver()
    assert in_code.cluster_spec().as_dict() == W2 and in_code.task_type == "worker"


def test_local_layout_picks_distinct_loopback_ports():
    spec = ClusterSpec.local_layout({"chief": 1, "worker": 2, "ps": 2})
    addresses = [a for job in spec.jobs.values() for a in job]
    assert len(set(addresses)) == 5 and all(a.startswith("127.0.0.1:") for a in addresses)


def test_local_layout_rejects_bad_counts():
    with pytest.raises(ClusterSpecError, match=r"roles\.worker: task count"):
        ClusterSpec.local_layout({"worker": -1})
    with pytest.raises(ClusterSpecError, match="'chief'"):
        ClusterSpec.local_layout({"master": 1})


def test_shipped_spec_files_are_valid():
    assert load_spec("cluster_specs/local-2-workers.json").roles == {"worker": 2}
    assert load_spec("cluster_specs/local-chief-2-workers.json").roles == {"chief": 1, "worker": 2}


@pytest.mark.parametrize("content,words", [
    ('{"roles": {"worker": 2}, "gpus": 1}', "unknown key"),
    ('{"name": "x"}', "exactly one of 'roles' and 'cluster'"),
    ('{"roles": {"worker": 2, "chief": 2}}', "at most one"),
    ('{"roles": {}}', "non-empty mapping"),
    ('{"cluster": {"worker": ["h:1"]}, "host": "h"}', "only applies to the 'roles' form"),
    ("{not json", "cannot be parsed"),
])
def test_bad_spec_files(tmp_path, content, words):
    path = tmp_path / "spec.json"
    path.write_text(content)
    with pytest.raises(ClusterSpecError, match=words):
        load_spec(str(path))


def test_yaml_spec_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: y\nroles:\n  chief: 1\n  worker: 1\n  ps: 1\n")
    assert load_spec(str(path)).roles == {"chief": 1, "worker": 1, "ps": 1}
