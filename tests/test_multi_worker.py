"""Keras 3 under MultiWorkerMirroredStrategy with 2 real worker processes started by `kdist launch`.

One cluster run (tests/programs/mwms_job.py) exercises fit/evaluate/predict, dict inputs, the
callbacks and the regression evidence for every Keras workaround; the tests below read what each
worker reported.
"""

import collections
import json
import os
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_kdist, run_python
from kdist.keras_seam import patches as keras_seam
from kdist.keras_seam.versions import version


WORKERS = ("worker:0", "worker:1")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("mwms")
    (out / "tmp").mkdir()  # the workers' TMPDIR: their private temporary files land here
    result = run_kdist(["launch", "--workers", "2", "--timeout", "300", "--",
                        sys.executable, "tests/programs/mwms_job.py", str(out)], timeout=330,
                       env={"TMPDIR": str(out / "tmp")})
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    reports = {task: json.load(open(out / f"{task}.json")) for task in WORKERS}
    return {"out": out, "stdout": result.stdout, "reports": reports}


def both(job, key):
    return [job["reports"][task][key] for task in WORKERS]


def test_strategy_is_multi_worker_with_two_replicas(job):
    assert both(job, "strategy") == ["CollectiveAllReduceStrategy"] * 2
    assert both(job, "replicas") == [2, 2]
    assert both(job, "is_chief") == [True, False]


def test_fit_lowers_the_loss_identically_on_both_workers(job):
    first, second = both(job, "loss")
    assert first == second
    assert first[-1] < 0.75 * first[0]
    assert both(job, "val_accuracy")[0][-1] > 0.85


def test_both_workers_end_with_identical_weights(job):
    first, second = (np.load(job["out"] / f"{task}-weights.npz") for task in WORKERS)
    assert all(np.array_equal(first[k], second[k]) for k in first.files)


def test_evaluate_counts_every_example_once(job):
    for report in job["reports"].values():
        assert report["evaluate"]["accuracy"] == pytest.approx(report["reference_accuracy"], abs=1e-6)
        assert report["evaluate"]["loss"] == pytest.approx(report["reference_loss"], rel=1e-5)


def test_metric_sync_bug_upstream_on_keras_before_3_10_only(job):
    """keras-team/keras#21061: without kdist's workaround, Keras < 3.10 does not combine metric
    variables across workers (evaluate is off); Keras >= 3.10 does it itself."""
    for report in job["reports"].values():
        before_3_10 = version(report["keras"]) < (3, 10, 0)
        assert report["metric_fix_active"] is before_3_10
        upstream_exact = report["unsynced_evaluate"]["accuracy"] == pytest.approx(
            report["reference_accuracy"], abs=1e-6)
        assert upstream_exact is not before_3_10


def test_predict_returns_rows_in_input_order(job):
    assert both(job, "predict_rows") == [203, 203]


def test_predict_on_batch_returns_the_batchs_rows(job):
    """Workaround predict_on_batch_under_replicas: one prediction per row, in input order, for
    even, uneven and one-row batches; Keras as shipped returns every replica's (2 x 64 rows)."""
    assert both(job, "predict_on_batch_rows") == [[64, 3, 1]] * 2
    assert max(both(job, "predict_on_batch_max_diff")) < 1e-5
    assert both(job, "unpatched_predict_on_batch_rows") == [128, 128], \
        "upstream fixed? give predict_on_batch_under_replicas its fixed_in"
    assert max(both(job, "predict_numpy_max_diff") + both(job, "predict_dataset_max_diff")) < 1e-5


def test_dict_inputs_train_and_predict(job):
    """keras-team/keras#20329."""
    first, second = both(job, "dict_loss")
    assert first == second and len(first) == 2
    assert max(both(job, "dict_predict_max_diff")) < 1e-5


def test_in_memory_data_is_partitioned_across_workers(job):
    """Workaround consistent_array_shuffle: the workers' shards of one shuffled epoch cover every
    example exactly once; without it (Keras <= 3.15 as shipped) they overlap. Keras 3.16 shuffles
    with the same stateless seed on every worker: fixed upstream, and the fix is not installed."""
    patched = sorted(sum(both(job, "patched_shard"), []))
    assert patched == list(range(61))
    unpatched = sum(both(job, "unpatched_shard"), [])
    assert len(unpatched) == 61
    for report in job["reports"].values():  # Keras's own dataset, which kdist replaces: unbuilt
        fixed = keras_seam.patch("consistent_array_shuffle").applies(keras.__version__,
                                                                    tf.__version__)
        assert report["array_datasets_built"] == {"patched": 0 if fixed else 1, "unpatched": 1}
    if version(keras.__version__) >= (3, 16, 0):
        assert sorted(unpatched) == list(range(61))
        assert not keras_seam.patch("consistent_array_shuffle").applies(keras.__version__,
                                                                         tf.__version__)
    else:
        assert len(set(unpatched)) < 64, "upstream fixed? give the workaround its fixed_in"


def test_every_epoch_is_a_new_permutation_partitioned_across_workers(job):
    """Each epoch of a shuffled in-memory fit: the workers' shares cover every example once
    (a short last batch included), and the order changes from epoch to epoch."""
    first, second = both(job, "patched_shards")
    epochs = [a + b for a, b in zip(first, second)]
    assert [sorted(epoch) for epoch in epochs] == [list(range(61))] * 3
    if keras_seam.patch("consistent_array_shuffle").applies(keras.__version__, tf.__version__):
        assert len({tuple(a) for a in first}) == 3  # kdist's shuffle; Keras >= 3.16 its own


def test_upstream_bugs_still_need_the_workarounds(job):
    """Regression evidence for symbolic_build_without_collective and scalar_metric_reduce: Keras
    as shipped still crashes; if these start passing, upstream fixed the bugs."""
    for report in job["reports"].values():
        assert "Attempt to convert a value (PerReplica" in report["unpatched_fit_error"]
        assert "Invalid reduction dimension 0" in report["only_build_patched_fit_error"]
        assert report["workarounds"] == [w.name for w in keras_seam.PATCHES if w.applies(
            keras.__version__, tf.__version__)]


def test_only_the_chief_prints_the_progress_bar(job):
    lines = job["stdout"].splitlines()
    assert any(l.startswith("[worker-0]") and "Epoch 1/4" in l for l in lines)
    assert not any(l.startswith("[worker-1]") and "Epoch" in l for l in lines)


def test_model_checkpoint_writes_the_users_path_from_the_chief_only(job):
    checkpoint_dir = job["out"] / "ckpt"
    assert sorted(os.listdir(checkpoint_dir)) == [f"model-{e}.keras" for e in range(1, 5)]
    chief_dir, other_dir = both(job, "checkpoint_dir")
    assert chief_dir == str(checkpoint_dir)
    assert other_dir != chief_dir and not os.path.exists(other_dir)  # written privately, removed
    restored = keras.saving.load_model(checkpoint_dir / "model-4.keras")
    final = np.load(job["out"] / "worker:0-weights.npz")
    assert all(np.array_equal(a, final[k]) for a, k in zip(restored.get_weights(), final.files))


def test_tensorboard_logs_from_the_chief_only(job):
    tensorboard = job["out"] / "tensorboard"
    assert sorted(os.listdir(tensorboard)) == ["train", "validation"]
    assert all(len(os.listdir(tensorboard / d)) == 1 for d in ("train", "validation"))
    assert both(job, "leftover_temp_dirs") == [[], []]
    assert os.listdir(job["out"] / "tmp") == []


def test_backup_and_restore_resumes_every_worker_from_the_chiefs_backup(job):
    assert both(job, "resumed_from_backup") == [True, True]
    assert both(job, "resumed_epochs_run") == [1, 1]  # epochs 0 and 1 came from the backup
    first, second = both(job, "weights_after_two_checksum")
    assert first == second
    assert not (job["out"] / "backup").exists()  # the chief deleted it after the resumed run


def test_stock_keras_callbacks_write_each_file_once_from_the_chief(job):
    expected = ["best.keras", "e1.keras", "e2.keras", "log.csv", "m.weights.h5"]
    for report in job["reports"].values():
        files = [f for f in report["stock_files"] if not f.startswith(("tb/", "backup/"))]
        assert files == expected, report["stock_files"]
        backup = [f for f in report["stock_files"] if f.startswith("backup/")]
        # kdist's backup: the last two generations, each a weights file and its manifest
        assert [re.sub(r"generation-\d+", "generation-N", f) for f in backup] == \
            ["backup/generation-N/manifest.json", "backup/generation-N/model.weights.h5"] * 2, backup
        assert report["stock_csv_rows"] == 3  # header + one row per epoch, written once
        assert report["stock_event_writers"] == 1  # one TensorBoard writer: the chief's
        assert report["stock_weights_load"] is True
        assert report["leftover_temp_dirs_after_stock"] == []


def test_upstream_stock_callbacks_write_from_every_worker(job):
    """Without kdist's fix (uninstalled in the job), both workers write TensorBoard event files
    into the user's directory. When this fails, Keras fixed it upstream: drop the workaround."""
    for report in job["reports"].values():
        assert report["unpatched_event_files"] == 2


def test_a_worker_loads_the_chiefs_save_after_kdist_barrier(job):
    for report in job["reports"].values():
        assert report["loaded_after_barrier_same"] is True


def test_a_generator_or_pydataset_step_agrees_on_no_end_of_data(job):
    """Fixes generator_steps_without_end_agreement and consistent_pydataset_order (ending_together):
    kdist's pipelines of a generator's and a PyDataset's batches yield one share per replica for
    every global batch on every worker, so all run out at the same step and the step holds no
    cross-worker agreement on whether data is left (TensorFlow's partial-batch handling, one more
    all-reduce in every step, about 2 ms of a 4.5 ms step on 2 workers): as many TensorFlow
    all-reduces as a shuffled array's, whose endless pipeline TensorFlow never asks."""
    for report in job["reports"].values():
        counts = report["all_reduces_by_input"]
        assert counts["generator"] == counts["PyDataset"] == counts["arrays, shuffled"], counts


def test_kdists_epoch_reports_ride_the_ring_not_a_traced_all_gather(job):
    """The replica check and the stragglers' figures at every epoch's end gather a row from each
    worker: over kdist's TCP ring where it sums the gradients, so the first epoch traces no
    all-gather of TensorFlow's for them (two, about 120 ms each, before); every worker gets
    every row, in worker order, float64 bits intact."""
    for report in job["reports"].values():
        assert report["host_gathers_traced"] == 0
        assert report["host_rows"] == [[0.0, 0.5], [1.0, 1.5]]


def test_metrics_are_read_and_reset_without_tensorflows_collectives(job):
    """Hook metric_results_in_one_sum and fix metric_reset_without_collective: reading the
    metrics outside a step (each epoch's end, evaluate's) sums every metric variable over kdist's
    TCP ring at once, and a reset reads nothing back: no TensorFlow collective between the
    workers, each of which leaves about 2 KB behind (benchmarks/soak.py); the same values as
    TensorFlow's reduces, one per variable upstream (the loss tracker's two, accuracy's two)."""
    for report in job["reports"].values():
        assert report["metric_read_reduces"] == 0 and report["metric_reset_reduces"] == 0
        assert report["metric_read_reduces_upstream"] == 4
        reads = report["metric_reads"]
        assert set(reads["ring"]) == set(reads["tf"]) == {"loss", "accuracy"}, reads
        for name, value in reads["tf"].items():
            assert reads["ring"][name] == pytest.approx(value, rel=1e-6), reads


def test_topks_payloads_ride_the_ring_not_tensorflows_all_gather(job):
    """TopK(0.1) sends each kernel's largest entries and their indices, which every worker
    gathers: over kdist's TCP ring where it sums the gradients (one collective per dtype: the
    values, the indices), so the step holds no all-gather of TensorFlow's, whose gRPC
    collectives cost several times the ring's time on the same bytes."""
    for report in job["reports"].values():
        ops = report["topk_step_ops"]
        assert ops["TopKV2"] >= 2 and ops.get("CollectiveGatherV2", 0) == 0, ops  # 2 kernels
        assert ops["PyFunc"] >= 3, ops  # the dense sums, TopK's values, its indices (per graph)


def test_a_worker_leaves_only_when_the_chief_has_ended_its_program(job):
    """The last collective's data may still be read from a worker that has its own result: the
    workers leave together (strategies/multi_worker.py), so the worker that ended 3 s before the
    chief leaves after it."""
    out = job["out"]
    chief_ended = float((out / "chief-ended").read_text())
    assert float((out / "left-1").read_text()) >= chief_ended
    assert float((out / "left-0").read_text()) >= chief_ended


def test_tf_servers_listen_on_their_tf_config_ports(job):
    """TF's gRPC server binds its port on every interface (grpc_server_lib.cc hard-codes 0.0.0.0);
    kdist can only hand it loopback addresses. This documents that, and fails if TF changes."""
    for report in job["reports"].values():
        assert len(report["listening"]) == 1
        address, port = report["listening"][0].rsplit(":", 1)
        assert address in ("0.0.0.0", "::")  # not 127.0.0.1: then the README's advice changes


def test_kdist_adds_no_op_to_the_traced_train_step(job):
    """kdist's patches act at trace time (or only under PS): without the step clock, the step TF
    runs is the one a user writing MWMS + fit by hand, with the workarounds fit needs to run and
    to log right, gets, but for the sums: on these CPU workers kdist's TCP ring takes the
    gradients' by default, and the logs' (loss and accuracy) in one more, two PyFuncs in place of
    TensorFlow's three CollectiveReduceV2 and their packing ops; each replica's gradients are
    weighed by its examples (kdist.exchange.weights: its batch size, a product before the sum and
    a quotient after), and an empty share's loss and metrics are skipped in two conds. The step
    clock adds its three readings and nothing else."""
    for report in job["reports"].values():
        ops = report["train_step_ops"]
        assert sum(ops["kdist"].values()) > 50
        kdist_ops, by_hand = collections.Counter(ops["kdist"]), collections.Counter(ops["by_hand"])
        added, removed = kdist_ops - by_hand, by_hand - kdist_ops
        weighing = {"Mul", "Cast", "Shape", "StridedSlice", "DivNoNan"}
        weighing |= {"Size", "Greater", "SelectV2"}  # Keras < 3.8: an empty batch's loss is 0
        # an empty share computes no loss and no metric (kdist.exchange.empty_shares): each in a
        # cond on the replica's examples. TensorFlow's gradient of the loss's cond traces its
        # branch again (the loss op once more) and carries its intermediates as optionals; the
        # metrics' other branch reads them (ReadVariableOp, DivNoNan); Keras 3.5's loss adds its
        # sum and a constant again there (AddV2, Const).
        guard = {"StatelessIf", "If", "Greater", "Placeholder", "Identity", "NoOp", "ZerosLike",
                 "OptionalFromValue", "OptionalNone", "OptionalGetValue", "ReadVariableOp",
                 "DivNoNan", "Sum", "SparseSoftmaxCrossEntropyWithLogits", "AddV2", "Const"}
        assert added["StatelessIf"] + added["If"] >= 2, added  # the loss's and the metrics'
        assert set(added) <= {"PyFunc", "Pack", "Unpack", "RealDiv"} | weighing | guard, added
        # per graph that holds the step (one or two): the gradients' PyFunc, and the logs' where
        # they are reduced in the same graph as the gradients (else one packed TF all-reduce)
        sums = (added["PyFunc"], removed["CollectiveReduceV2"])
        assert sums in {(2 * g, 3 * g) for g in (1, 2)} | {(g, 2 * g) for g in (1, 2)}, sums
        assert kdist_ops["CollectiveReduceV2"] == by_hand["CollectiveReduceV2"] - sums[1]
        assert set(removed) <= {"CollectiveReduceV2", "Placeholder", "Const", "Pack", "Prod",
                                "Identity", "IdentityN", "RealDiv", "Reshape", "SplitV",
                                "ConcatV2"}, removed
        # with the step clock (the default): three readings, each a timestamp in a cond on one
        # value of each tensor, written to the clock's variable (counted once per graph that
        # holds the step: the step's own, and its caller's where Keras inlines it)
        added = {k: ops["watched"].get(k, 0) - ops["kdist"].get(k, 0)
                 for k in set(ops["watched"]) | set(ops["kdist"])}
        assert added.pop("Timestamp") in (6, 12) and min(added.values()) >= 0  # 2 branches each
        assert added.pop("StatelessIf", 0) + added.pop("If", 0) in (3, 6)
        readings = {"Reshape", "StridedSlice", "Cast", "AddN", "IsNan", "Const", "Identity",
                    "ResourceStridedSliceAssign", "ReadVariableOp", "AddV2", "Placeholder", "NoOp",
                    "Sum"}
        assert {kind for kind, count in added.items() if count} <= readings, added


@pytest.fixture(scope="module")
def gradient_sums(tmp_path_factory):
    """The same training (global batch 96) on one device, and on 2 and 3 workers by default
    (kdist's TCP ring) and with TensorFlow's collectives (all_reduce='ring'), 2 workers."""
    out = tmp_path_factory.mktemp("tcp")
    program = [sys.executable, "tests/programs/tcp_job.py", str(out)]
    alone = run_python(program[1:] + ["auto"], timeout=120, env={"TF_CONFIG": ""})
    assert alone.returncode == 0, alone.stderr[-3000:]
    runs = {"one device": [np.load(out / "weights-auto-1-local.npz")]}
    for all_reduce, workers, ring in (("auto", 2, True), ("auto", 3, True), ("ring", 2, False)):
        result = run_kdist(["launch", "--workers", str(workers), "--timeout", "240", "--",
                            *program, all_reduce], timeout=270)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert result.stdout.count(f"ring {ring}") == workers, result.stdout[-2000:]
        runs[all_reduce, workers] = [np.load(out / f"weights-{all_reduce}-{workers}-worker:{i}.npz")
                                     for i in range(workers)]
    return runs


@pytest.mark.parametrize("workers", [2, 3])
def test_the_default_tcp_ring_trains_as_one_device_with_the_global_batch(gradient_sums, workers):
    """By default CPU workers sum their gradients over kdist's TCP ring: every worker ends bit
    for bit equal, and equal to one device with the global batch within float32 summation
    order, as TensorFlow's collectives are."""
    ring, alone = gradient_sums["auto", workers], gradient_sums["one device"][0]
    names = [n for n in alone.files if n.startswith("arr_")]
    assert names and all(np.array_equal(ring[0][n], other[n]) for other in ring[1:] for n in names)
    assert max(float(np.abs(ring[0][n] - alone[n]).max()) for n in names) < 1e-5
    tf_collectives = gradient_sums["ring", 2][0]
    assert max(float(np.abs(tf_collectives[n] - alone[n]).max()) for n in names) < 1e-5
    assert ring[0]["loss"][-1] < ring[0]["loss"][0] / 2
