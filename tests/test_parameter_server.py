"""Keras 3 under ParameterServerStrategy: chief + 2 workers + 2 ps as real processes.

tests/programs/ps_job.py runs on every task under `kdist launch --spec cluster_specs/local-ps.json`;
the chief trains (killing worker 1 mid-fit), the others serve and exit by themselves.
"""

import json
import re
import sys

import numpy as np
import pytest

from conftest import run_kdist


FAST_EXIT = {"KDIST_CHIEF_GRACE": "2"}  # servers leave 2 s after the chief is gone


def launch_ps_job(out, mode, extra=(), env=FAST_EXIT):
    return run_kdist(["launch", "--spec", "cluster_specs/local-ps.json", "--timeout", "240", *extra,
                      "--", sys.executable, "tests/programs/ps_job.py", str(out), mode], timeout=270,
                     env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("ps")
    result = launch_ps_job(out, "train", env={})  # the default chief grace (10 s)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return {"report": json.load(open(out / "train.json")), "stdout": result.stdout, "out": out}


def test_fit_lowers_the_loss_with_one_history_value_per_epoch(trained):
    history = trained["report"]["history"]
    assert trained["report"]["strategy"] == "ParameterServerStrategyV2"
    assert all(len(values) == 3 for values in history.values())
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert history["val_accuracy"][-1] > 0.9


def test_metrics_count_every_step_once_per_epoch(trained):
    """16 steps x 32 examples per epoch: exact only with atomic ps updates (workaround
    atomic_assign_under_parameter_server) and metrics reset at every epoch start."""
    history = trained["report"]["history"]
    assert history["examples"] == [512.0, 512.0, 512.0]
    assert history["val_examples"] == [600.0, 600.0, 600.0]
    assert all(0.0 <= a <= 1.0 for a in history["accuracy"])


def test_evaluate_and_predict_are_exact(trained):
    report = trained["report"]
    assert report["evaluate"]["examples"] == 600.0
    assert report["evaluate"]["accuracy"] == pytest.approx(report["reference_accuracy"], abs=1e-6)
    assert report["evaluate"]["loss"] == pytest.approx(report["reference_loss"], rel=1e-5)
    assert report["predict_rows"] == 600 and report["predict_max_diff"] < 1e-5


def test_variables_live_on_both_ps_and_partitioned_kernels_span_them(trained):
    devices = trained["report"]["devices"]
    assert {d.split("/device")[0] for d in devices.values()} == {"/job:ps/replica:0/task:0",
                                                                 "/job:ps/replica:0/task:1"}
    shards = [d for path, d in devices.items() if "kernel_shard" in path]
    assert len(shards) == 2 and len(set(shards)) == 2
    embedding = [d for path, d in trained["report"]["embedding_devices"].items() if "shard" in path]
    assert len(embedding) == 2 and len(set(embedding)) == 2


def test_partitioned_embedding_trains_from_a_dataset_function(trained):
    losses = trained["report"]["embedding_loss"]
    assert losses[-1] < 0.5 * losses[0]
    # TF 2.21's ParameterServerStrategy traces the function once and always passes one input
    # pipeline (documented in kdist/ps/training.py; kdist's ps_shard_input=True gives one per
    # worker). If this changes, TF started sharding and the docs must say so.
    assert trained["report"]["input_contexts"] == [[0, 1]]


def test_a_dataset_built_in_the_program_trains_with_validation(trained):
    """Regression: the chief's Dataset was captured in a dataset function and the workers failed
    with "Unable to parse tensor proto"."""
    history = trained["report"]["dataset_history"]
    assert len(history["loss"]) == 3 and history["loss"][-1] < history["loss"][0]
    assert len(history["val_loss"]) == 3 and history["val_accuracy"][-1] > 0.6


def test_fit_without_steps_per_epoch_is_refused_with_the_fix(trained):
    assert "fit(steps_per_epoch=...) is required" in trained["report"]["missing_steps_per_epoch"]


def test_variable_partitioner_is_refused_by_fit_with_the_fix(tmp_path):
    result = launch_ps_job(tmp_path, "sharded")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    report = json.load(open(tmp_path / "sharded.json"))
    assert report["sharded_kernels"] >= 1  # the partitioner really made ShardedVariables
    assert "is a ShardedVariable (from variable_partitioner)" in report["sharded_refused"]
    assert "kdist.layers.PartitionedDense" in report["sharded_refused"]
    assert report["iterations"] == 0  # refused before any step


def test_a_dataset_from_a_python_generator_trains_too(trained):
    history = trained["report"]["generator_history"]
    assert len(history["loss"]) == 2 and history["examples"] == [4 * 32, 4 * 32]
    assert history["val_examples"] == [600.0, 600.0]  # validation_data as a dataset function


def test_gradient_compression_is_refused_with_the_reason(trained):
    assert "no gradient is exchanged as such" in trained["report"]["compression_refused"]


def test_steps_per_execution_runs_every_step_once(trained):
    """3 epochs x 16 steps with steps_per_execution=3: the optimizer applied exactly 48 updates."""
    assert trained["report"]["embedding_iterations"] == 48


def test_callbacks_see_epoch_logs(trained):
    import keras

    import kdist.layers  # noqa: F401  (registers PartitionedDense for loading)

    out = trained["out"]
    assert trained["report"]["early_stopping_best"] == min(trained["report"]["history"]["val_loss"])
    assert sorted(p.name for p in out.glob("ckpt-*.keras")) == [f"ckpt-{e}.keras" for e in (1, 2, 3)]
    restored = keras.saving.load_model(out / "ckpt-3.keras", compile=False)
    assert len(restored.get_weights()) == 5  # two kernel shards, bias, dense kernel and bias
    assert sorted(p.name for p in (out / "tensorboard").iterdir()) == ["train", "validation"]


def test_a_killed_worker_does_not_stop_fit(trained):
    assert trained["report"]["killed_pid"]
    assert "worker-1 exited with code 137; parameter-server training goes on without it" in \
        trained["stdout"]
    assert len(trained["report"]["history"]["loss"]) == 3


def test_every_server_exits_by_itself_after_the_chief(trained):
    for task in ("worker:0", "ps:0", "ps:1"):
        assert f"the chief finished; task {task} exits" in trained["stdout"]
    assert "grace period over" not in trained["stdout"]


def test_the_job_ends_within_two_seconds_of_the_chief(trained):
    """kdist launch tells the servers the chief succeeded (kdist.ps.serve.CHIEF_DONE_SIGNAL):
    they leave at once, not after the chief grace (10 s by default) without the chief."""
    ended = {name: float(at) for name, at in re.findall(
        r"\[kdist\]   (\S+): succeeded at ([\d.]+) s", trained["stdout"])}
    assert {"chief-0", "ps-0", "ps-1", "worker-0"} <= set(ended), trained["stdout"][-3000:]
    assert max(ended.values()) - ended["chief-0"] < 2.0, ended


@pytest.fixture(scope="module")
def ps_killed(tmp_path_factory):
    """kill_ps under kdist.scope(ps_evaluation="chief"), restarted once by the launcher."""
    out = tmp_path_factory.mktemp("kill_ps")
    result = launch_ps_job(out, "kill_ps", extra=["--max-restarts", "1"])
    assert result.returncode == 0, result.stdout[-4000:]
    return {"first": json.load(open(out / "kill_ps-0.json")),
            "restarted": json.load(open(out / "kill_ps-1.json")), "stdout": result.stdout}


def test_a_killed_ps_fails_clearly_and_the_restarted_job_resumes_from_backup(ps_killed):
    error = ps_killed["first"]["error"]
    assert error.startswith("ps:1 failed during training") and "BackupAndRestore" in error
    assert "chief-0 exited with code 3" in ps_killed["stdout"]
    assert "restarting every task (1/1)" in ps_killed["stdout"]
    # epoch 0 came from the backup written before the ps died
    assert ps_killed["restarted"]["epochs_run"] == 2


def test_chief_evaluation_stays_available_and_exact(ps_killed):
    """After the resumed fit, evaluate on the chief (ps_evaluation="chief") equals a plain Keras
    evaluation of the same weights."""
    evaluation = ps_killed["restarted"]["evaluate"]
    assert evaluation["examples"] == 600.0
    assert evaluation["accuracy"] == pytest.approx(ps_killed["restarted"]["reference_accuracy"],
                                                   abs=1e-6)


@pytest.fixture(scope="module")
def on_workers(tmp_path_factory):
    out = tmp_path_factory.mktemp("ps_workers")
    result = launch_ps_job(out, "workers")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return json.load(open(out / "workers.json"))


def test_evaluation_on_the_workers_counts_every_example_once_while_a_worker_dies(on_workers):
    """20,000 examples in 2 shards; worker 1 is SIGKILLed while they run: the coordinator runs its
    shard again on worker 0, and no example is lost or counted twice."""
    assert on_workers["killed_pid"]
    evaluation = on_workers["evaluate"]
    assert evaluation["examples"] == 20000.0
    assert evaluation["accuracy"] == pytest.approx(on_workers["reference_accuracy"], abs=1e-6)
    assert evaluation["loss"] == pytest.approx(on_workers["reference_loss"], rel=1e-5)


@pytest.mark.parametrize("source", ["numpy", "function"])
def test_ps_shard_input_gives_each_worker_its_own_part_of_the_data(on_workers, source):
    """Worker 0 trains on the even ids only, worker 1 on the odd ones, a whole pass of its half
    every 4 steps of 32. How the 48 steps split between the workers is the coordinator's choice:
    on a loaded machine a worker that starts late ran 1 step of 48 in one epoch, so the check holds
    for any split (and the program runs 2 epochs, so that both workers run steps)."""
    ids, steps = on_workers[f"ids_{source}"], on_workers[f"steps_{source}"]
    assert sum(steps) == 48 and min(steps) >= 1, steps
    for worker, (seen, ran) in enumerate(zip(ids, steps)):
        assert set(seen) <= set(range(worker, 256, 2)), f"worker {worker} saw the other half"
        assert len(seen) == min(128, 32 * ran), f"worker {worker}: {len(seen)} ids in {ran} steps"


def test_ps_shard_input_refuses_a_dataset_object_with_the_fix(on_workers):
    assert "ps_shard_input=True needs the training data as a dataset function" in \
        on_workers["dataset_object_refused"]


def test_a_metric_that_does_not_aggregate_by_sum_is_refused_for_worker_evaluation():
    import keras

    from kdist.ps import evaluation

    class Latest(keras.metrics.Metric):
        def __init__(self):
            super().__init__(name="latest")
            self.value_ = self.add_variable(shape=(), initializer="zeros", name="value",
                                            aggregation="only_first_replica")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.value_.assign(keras.ops.mean(y_pred))

        def result(self):
            return self.value_

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=[Latest()])
    model.evaluate(np.zeros((4, 2)), np.zeros((4, 1)), verbose=0)  # builds the metrics
    with pytest.raises(ValueError, match=r"latest/value aggregates by 'only_first_replica'.*"
                                         r"ps_evaluation='chief'"):
        evaluation._summable_metric_variables(model)
