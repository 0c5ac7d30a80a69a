"""kdist.layers.ModelParallelDense: exact against keras.layers.Dense on 1..4 logical CPUs, and the
hybrid data-parallel x model-parallel mode with 2 real MultiWorkerMirrored workers."""

import json
import sys

import pytest

from conftest import run_kdist, run_report


@pytest.fixture(scope="module")
def report():
    return run_report(["tests/programs/model_parallel_checks.py"], timeout=300)


def test_forward_and_gradients_equal_dense_for_1_to_4_devices(report):
    cases = report["equivalence"]
    assert {(c["devices"], c["partition"]) for c in cases} == {
        (n, p) for n in (1, 2, 3, 4) for p in ("column", "row")}
    assert any(len({tuple(s) for s in c["shard_shapes"]}) > 1 for c in cases)  # uneven splits
    assert max(c["max_diff"] for c in cases) < 1e-5


def test_each_device_holds_only_its_shard(report):
    for case in report["equivalence"]:
        assert len(case["shard_devices"]) == case["devices"]
        assert [d.rsplit(":", 1)[1] for d in case["shard_devices"]] == \
            [str(i) for i in range(case["devices"])]
        split_axis = 1 if case["partition"] == "column" else 0
        other_axis = 1 - split_axis
        assert sum(s[split_axis] for s in case["shard_shapes"]) == case["shape"][split_axis]
        assert all(s[other_axis] == case["shape"][other_axis] for s in case["shard_shapes"])


def test_column_then_row_equals_two_dense_layers(report):
    assert len(report["pairs"]) == 3 and max(report["pairs"]) < 1e-5


def test_initialisation_conversion_and_saving_are_exact(report):
    assert report["init_equal"] is True
    assert report["dense_round_trip"] is True
    assert report["saved"] == {"functional": True, "sequential": True}
    assert report["subclassed_shape"] == [4, 4]
    assert report["subclassed_vs_dense"] < 1e-6  # the layer inside a subclassed model is exact


@pytest.fixture(scope="module")
def tapes():
    return run_report(["tests/programs/tape_checks.py"], timeout=300)


@pytest.mark.parametrize("check", ["persistent", "second_order", "jacobian"])
def test_custom_loops_take_gradients_as_often_as_with_the_plain_layer(tapes, check):
    """A persistent tape asked twice, a tape inside a tape (gradient penalty), a Jacobian: the same
    numbers as keras.layers.Dense / Embedding, for both splits, 1 to 4 devices, uneven sizes."""
    cases = [c for c in tapes["cases"] if check in c]
    expected = {(layer, n, p) for layer in ("dense", "embedding") for n in (1, 2, 3, 4)
                for p in ("column", "row") if check != "jacobian" or layer == "dense"}
    assert {(c["layer"], c["devices"], c["partition"]) for c in cases} == expected
    for case in cases:
        assert isinstance(case[check], float) and case[check] < 1e-5, case


def test_trains_with_fit(report):
    assert report["fit_loss"][-1] < report["fit_loss"][0]


def test_clear_errors(report):
    errors = report["errors"]
    assert "'/cpu:9' does not exist" in errors["missing_device"]
    assert "partition='x'" in errors["bad_partition"]
    assert "devices=4: use 1 to 2" in errors["too_many_devices"]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """2 MultiWorkerMirrored workers x 2 logical CPUs each, one run shared by the tests below."""
    out = tmp_path_factory.mktemp("hybrid")
    result = run_kdist(["launch", "--workers", "2", "--timeout", "200", "--",
                        sys.executable, "tests/programs/hybrid_job.py", str(out)], timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    return [json.load(open(out / f"worker:{i}.json")) for i in (0, 1)]


def test_hybrid_trains_like_plain_keras_on_one_device_with_the_global_batch(hybrid):
    first, second = hybrid
    assert first["replicas"] == 2
    assert first["layers"] == ["ModelParallelDense", "ModelParallelDense", "Dense"]  # LayoutMap
    assert first["training_change"] > 1e-1
    assert first["max_weight_diff"] < 1e-6
    assert first["loss"] == pytest.approx(first["reference_loss"], rel=1e-5)
    assert first["weights"] == second["weights"]  # identical on both workers


def test_hybrid_splits_the_storage_of_every_shard_and_its_optimizer_slots(hybrid):
    """Each worker's second device holds exactly its half of each split kernel (and of the column
    layer's bias), with their momentum slots; under TF's own MultiWorkerMirrored every variable
    would sit on the replica's device."""
    for report in hybrid:
        assert report["variable_types"] == ["MirroredVariable"]  # still the strategy's variables
        assert {path: device for path, device in report["shard_devices"].items()
                if device == "device:CPU:1"} == {
            "up/kernel_shard_1": "device:CPU:1", "up/bias_shard_1": "device:CPU:1",
            "down/kernel_shard_1": "device:CPU:1"}
        second_half = sum(report["split_kernel_bytes"]) // 2 + 4 * 32 // 2
        assert report["model_bytes"]["device:CPU:1"] == second_half
        assert report["optimizer_bytes"]["device:CPU:1"] == second_half  # SGD momentum slots


def test_hybrid_sums_each_shards_gradients_in_its_own_devices_group(hybrid):
    for report in hybrid:
        assert report["own_groups"] == ["device:CPU:1"]


def test_hybrid_checkpoints_and_backup_and_restore_resume_exactly(hybrid):
    for report in hybrid:
        assert report["restored_diff"] == 0.0 and report["restored_output_diff"] == 0.0
        assert report["resumed_epochs"] == 1  # stock BackupAndRestore: epochs 0-1 were done
        assert report["resumed_diff"] == 0.0


def test_hybrid_with_one_device_per_worker_is_plain_data_parallelism(hybrid):
    for report in hybrid:
        assert report["single_device_placements"] == ["device:CPU:0"]
        assert not report["single_device_new_groups"]
        assert report["single_device_diff"] < 1e-6


@pytest.fixture(scope="module")
def layouts():
    return run_report(["tests/programs/layout_checks.py"], timeout=300)


@pytest.mark.parametrize("block, converted", [("mlp", ["ModelParallelDense"] * 2),
                                              ("feed_forward", ["ModelParallelDense"] * 2),
                                              ("embedding_rows", ["ModelParallelEmbedding"]),
                                              ("embedding_columns", ["ModelParallelEmbedding"])])
def test_a_keras_layout_map_converts_dense_and_embedding_layers_exactly(layouts, block, converted):
    """Keras's own DeviceMesh + LayoutMap, on TensorFlow: the sharded Dense (Embedding) layers
    become ModelParallelDense (ModelParallelEmbedding), the rest stays; outputs and training equal
    the unconverted model."""
    case = layouts[block]
    assert [name for name in case["layers"] if name.startswith("ModelParallel")] == converted
    assert case["layers"][-1] == "Dense"  # the head the map does not name stays replicated
    assert case["output_diff"] < 1e-5
    assert case["training_change"] > 1e-2 and case["trained_output_diff"] < 1e-5
    assert case["reloaded_output_diff"] == 0.0
    half = sum(case["kernel_bytes"]) // 2  # each device holds half of each split kernel
    assert case["kernel_bytes_per_device"] == {"0": half, "1": half}
    assert case["slot_bytes_per_device"] == {"0": half, "1": half}  # momentum next to its shard


def test_layouts_kdist_cannot_honour_are_refused_naming_the_variable(layouts):
    refused = layouts["refused"]
    assert "conv/kernel'] = (None, None, None, 'model')" in refused["conv"]
    assert "weight of Conv2D 'conv'" in refused["conv"]
    assert "norm/gamma'] = ('model',)" in refused["norm"]
    assert "down/bias'] = ('model',)" in refused["row_bias_split"] and "Fix: use (None,)" in \
        refused["row_bias_split"]
    assert refused["batch_axis"].startswith("DeviceMesh shape=(2, 2)")
    assert "the batch axis is the strategy's" in refused["batch_axis"]


def test_default_devices_need_at_least_two():
    """This test process has one CPU device and no GPU: the default placement must refuse."""
    from kdist.layers.model_parallel import ModelParallelDense

    with pytest.raises(ValueError, match="needs at least two devices"):
        ModelParallelDense(4)
