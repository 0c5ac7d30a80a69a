"""TF_CONFIG as platforms write it (tests/fixtures/tf_configs.py): what TF and kdist do with each,
a real 2-task training run on each accepted shape, and plain Keras untouched by kdist's patches."""

import json
import logging
import os
import sys

import pytest

from conftest import PROGRAMS, QUIET_TF
from fixtures.tf_configs import CORPUS
from kdist import ClusterSpec, ClusterSpecError
from kdist import global_state

PORTS = (2222, 2223)


def filled(entry, task_type, index, ports=PORTS):
    text = json.dumps(entry["tf_config"](task_type, index))
    return json.loads(text.replace("{0}", str(ports[0])).replace("{1}", str(ports[1])))


def tf_refusal(config):
    """What TensorFlow says of this TF_CONFIG: None when its resolver and strategies accept it."""
    import tensorflow as tf
    from tensorflow.python.distribute import multi_worker_util

    os.environ["TF_CONFIG"] = json.dumps(config)
    try:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
        multi_worker_util._validate_cluster_spec(resolver.cluster_spec(), resolver.task_type,
                                                 resolver.task_id)
    except ValueError as err:
        return str(err)
    finally:
        del os.environ["TF_CONFIG"]
    return None


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def clear(self):
        self.records = []


@pytest.fixture
def caplog():
    """The "kdist" logger's warnings (it does not propagate to the root logger)."""
    handler = Records()
    logger = logging.getLogger("kdist")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: e["platform"])
def test_kdist_is_never_stricter_than_tensorflow(entry, caplog):
    for task_type, index in entry["tasks"]:
        config = filled(entry, task_type, index)
        refusal = tf_refusal(config)
        assert (refusal is None) == (entry["tf"] == "accepts"), refusal
        global_state.clear()  # the keys already warned about, among the rest
        caplog.clear()
        if entry["kdist"] == "refuse":
            with pytest.raises(ClusterSpecError, match="Fix:") as err:
                ClusterSpec.from_tf_config(config)
            assert err.value.field == entry["field"]
            continue
        spec = ClusterSpec.from_tf_config(config)
        assert spec.task == f"{task_type}:{index}"
        warnings = [r.getMessage() for r in caplog.records]
        if entry["kdist"] == "warn":
            assert len(warnings) == 1 and entry["field"] in warnings[0], warnings
        else:
            assert warnings == []
        assert entry["kdist"] != "refuse" or entry["tf"] == "accepts"  # (checked above)
    # kdist refuses only what TF refuses, or a mistake inside "task"
    if entry["kdist"] == "refuse" and entry["tf"] == "accepts":
        assert entry["field"].startswith("TF_CONFIG.task.")


def test_an_unknown_top_level_key_is_warned_about_once(caplog):
    global_state.clear()  # the keys already warned about, among the rest
    config = {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}, "x": 1}
    ClusterSpec.from_tf_config(config)
    ClusterSpec.from_tf_config(config)
    assert len(caplog.records) == 1 and "TF_CONFIG.x" in caplog.records[0].getMessage()


TRAINED = [e for e in CORPUS if e["kdist"] != "refuse"]


@pytest.mark.parametrize("entry", TRAINED, ids=lambda e: e["platform"])
def test_each_accepted_platform_shape_trains_on_2_real_workers(entry, tmp_path):
    """The platform's TF_CONFIG (local addresses) for each task, the two kdist lines, plain fit."""
    from kdist.launch import Launcher

    ports = [int(a.rsplit(":", 1)[1]) for a in ClusterSpec.local_layout({"worker": 2}).jobs["worker"]]
    tasks = entry["tasks"]
    cluster = ClusterSpec.from_tf_config(filled(entry, *tasks[0], ports=ports))
    log = open(tmp_path / "log.txt", "w")

    def platform_command(task_type, index):
        env = dict(os.environ, **QUIET_TF,
                   TF_CONFIG=json.dumps(filled(entry, task_type, index, ports=ports)))
        return [sys.executable, os.path.join(PROGRAMS, "platform_job.py"), str(tmp_path)], env

    code = Launcher(ClusterSpec(cluster.jobs), None, timeout=240, output=log,
                    task_command=platform_command).run()
    log.close()
    assert code == 0, (tmp_path / "log.txt").read_text()[-4000:]
    reports = [json.loads((tmp_path / f"{t}:{i}.json").read_text()) for t, i in tasks]
    assert {r["strategy"] for r in reports} == {"CollectiveAllReduceStrategy"}  # = MWMS
    assert {r["replicas"] for r in reports} == {2}
    assert reports[0]["weights"] == reports[1]["weights"]  # bit for bit across workers
    assert reports[0]["loss"][-1] < reports[0]["loss"][0]


FOREIGN_WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


@pytest.mark.parametrize("tf_config,env", [
    ('{"cluster": "garbage", "job": 1}', {}),  # hostile: kdist.scope() would refuse it
    (json.dumps({"cluster": {"chief": ["127.0.0.1:3"], "ps": ["127.0.0.1:4"], **FOREIGN_WORKERS},
                 "task": {"type": "worker", "index": 1}, "job": {"id": 7}}), {}),
    # A multi-worker TF_CONFIG: importing kdist there means "build MultiWorkerMirrored before the
    # first op" (the tutorials' order); KDIST_EAGER_MULTI_WORKER=0 is how a script opts out.
    (json.dumps({"cluster": FOREIGN_WORKERS, "task": {"type": "worker", "index": 1}}),
     {"KDIST_EAGER_MULTI_WORKER": "0"}),
], ids=["hostile", "foreign-ps-worker", "foreign-mwms-worker"])
def test_plain_keras_is_untouched_by_kdist_whatever_tf_config_holds(tf_config, env):
    from conftest import run_python

    result = run_python([os.path.join(PROGRAMS, "foreign_tf_config.py")], timeout=120,
                        env={"TF_CONFIG": tf_config, **env})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["same_weights"]
    assert report["patched_has_bar"] and report["patched_printed"] == report["plain_printed"]
