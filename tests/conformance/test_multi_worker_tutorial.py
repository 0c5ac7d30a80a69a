"""Conformance: a Keras user's MultiWorkerMirrored script (tutorials' order and idioms, only the
two kdist lines added) on 2 real workers. See programs/multi_worker_tutorial.py."""

import json
import os
import sys

import pytest

from conftest import ROOT, run_kdist
from kdist.keras_seam import keras_internals, versions

WORKERS = ("worker:0", "worker:1")
PROGRAM = os.path.join(ROOT, "tests", "conformance", "programs", "multi_worker_tutorial.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("conformance_mwms")
    result = run_kdist(["launch", "--workers", "2", "--timeout", "400", "--", sys.executable, PROGRAM,
                        str(out)], timeout=450)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    return {"out": out, "reports": {t: json.load(open(out / f"{t}.json")) for t in WORKERS}}


def outcome(run, name):
    """The scenario's outcome, the same on both workers, and successful."""
    first, second = (run["reports"][t][name] for t in WORKERS)
    assert first["ok"], first.get("error", "") + first.get("trace", "")
    assert first == second  # every figure identical: the workers trained in lockstep
    return first


def falls(losses):
    return losses[-1] < losses[0]


def test_the_tutorials_order_dataset_before_scope_trains(run):
    result = outcome(run, "tutorial_fit")
    assert result["replicas"] == 2 and falls(result["loss"])


def test_options_after_the_first_op_are_refused_with_the_way_out(run):
    message = outcome(run, "options_after_the_first_op")["refused"]
    assert "all_reduce='ring'" in message and "before the first TensorFlow op" in message


def test_save_on_the_chief_then_load_and_continue_everywhere(run):
    result = outcome(run, "save_on_chief_then_load_everywhere")
    assert result["restored_digest_before"] == result["saved_digest"]
    assert result["continued_digest"] != result["saved_digest"]
    assert sorted(p for p in os.listdir(run["out"]) if p.endswith(".keras")) == ["saved.keras"]


def test_stock_backup_and_restore_resumes_where_it_stopped(run):
    result = outcome(run, "backup_and_restore_resumes")
    assert result["epochs_run"] == 2  # epochs 3 and 4 of 4: 1 and 2 came from the backup
    assert result["backup_left"] is False  # deleted once training finished


def test_distribute_datasets_from_function(run):
    assert falls(outcome(run, "distribute_datasets_from_function")["loss"])


def test_auto_shard_policy_data(run):
    assert falls(outcome(run, "auto_shard_policy_data")["loss"])


def test_custom_train_step_in_a_subclassed_model(run):
    assert falls(outcome(run, "custom_train_step")["loss"])


def test_steps_per_execution_4_equals_1(run):
    """Keras >= 3.7: 4 steps per execution train as 1 does. Keras <= 3.6 aborts the all-reduce
    when an epoch ends inside an execution: kdist refuses it with the fix (wiring/dispatch.py)."""
    if not versions.for_running_keras(keras_internals.STEPS_PER_EXECUTION_SAFE_WITH_REPLICAS):
        reports = [run["reports"][t]["steps_per_execution"] for t in WORKERS]
        assert [r["ok"] for r in reports] == [False, False]
        assert all("Use steps_per_execution=1, or Keras >= 3.7" in r["error"] for r in reports)
        return
    result = outcome(run, "steps_per_execution")
    assert result["iterations"] == 20  # 640 examples / 64 per step x 2 epochs, in executions of 4
    assert result["max_diff_vs_1"] < 1e-6


def test_stock_callbacks_list_writes_once_and_decides_together(run):
    result = outcome(run, "stock_callbacks_list")
    assert result["epochs_run"] == 2  # EarlyStopping stopped both workers after the same epoch
    assert result["learning_rate"] == pytest.approx(0.05 * 0.5 ** 2)
    assert result["files"] == ["best.weights.h5", "ckpt-01.keras", "ckpt-02.keras", "history.csv",
                               "logs"]
    csv_rows = open(run["out"] / "callbacks" / "history.csv").read().splitlines()
    assert len(csv_rows) == 3  # header + 2 epochs, written by the chief alone
    train_events = os.listdir(run["out"] / "callbacks" / "logs" / "train")
    assert len(train_events) == 1


def test_mixed_precision_with_compression(run):
    result = outcome(run, "mixed_precision")
    assert result["mixed_float16"]["optimizer"] == "LossScaleOptimizer"
    assert falls(result["mixed_float16"]["loss"]) and falls(result["mixed_bfloat16"]["loss"])


def test_jit_compile_true_is_refused_on_cpu_with_the_reason_and_auto_trains(run):
    result = outcome(run, "jit_compile")
    assert result["auto"] == {"trained": True, "jit_compile": False}
    assert not result["True"]["trained"] and "b/194942685" in result["True"]["error"]
