"""MirroredStrategy over logical CPU devices: the synchronous-SGD claim, checked numerically."""

import functools

import pytest

from conftest import run_report
from kdist.keras_seam.versions import version



@functools.lru_cache(maxsize=None)
def equivalence(replicas):
    """One fresh process per replica count (the CPU is split before TF starts), shared by tests."""
    return run_report(["tests/programs/mirrored_equivalence.py", str(replicas)], timeout=240)


@pytest.mark.parametrize("replicas", [2, 4])
def test_n_replicas_equal_one_device_with_n_times_the_batch(replicas):
    report = equivalence(replicas)
    assert report["strategy"] == "MirroredStrategy" and report["replicas"] == replicas
    assert report["variable_type"] == "MirroredVariable"
    assert report["global_batch"] == 8 * replicas
    assert report["training_change"] > 1e-2  # the weights really moved...
    assert report["max_weight_diff"] < 1e-5  # ...and identically to one device with batch n*b
    assert report["loss"] == pytest.approx(report["reference_loss"], rel=1e-5)
    assert report["loss"][1] < report["loss"][0]
    assert report["bare_scope_replicas"] == replicas  # regression: it silently became 1
    keras_from_3_7 = version(report["keras"]) >= (3, 7, 0)
    if keras_from_3_7:
        # steps_per_execution=3 trains exactly like 1
        assert report["spe3_refused"] is None
        assert report["spe3_iterations"] == 10  # 2 epochs x 5 batches: the partial execution too
        assert report["spe3_max_weight_diff"] < 1e-6
    else:  # Keras <= 3.6 aborts the all-reduce at the end of an epoch: refused before it starts
        assert "Keras <= 3.6 aborts the gradient all-reduce" in report["spe3_refused"]
    # Upstream (the workaround uninstalled): keras-team/keras#19246, from Keras 3.7 (its
    # tf.while_loop); Keras <= 3.6 unrolls the steps and works as shipped.
    assert report["spe3_fix_active"] is keras_from_3_7
    if keras_from_3_7:
        assert "while/cond/Placeholder" in report["spe3_upstream_error"]


@pytest.mark.parametrize("replicas", [2, 4])
def test_a_metric_reset_reduces_nothing(replicas):
    """Fix metric_reset_without_collective: `reset_metrics()` (each epoch's start in fit and
    evaluate) zeroes every replica's copy of each metric variable and reduces none; upstream,
    TensorFlow reads each assigned variable back across the replicas (under MultiWorkerMirrored a
    collective between the workers per variable per epoch, each leaving memory behind)."""
    report = equivalence(replicas)
    assert report["metric_variables"] >= 2  # the loss tracker's total and count
    assert report["reset_reduces"] == 0
    assert report["metric_copies_reset"] == [0.0] * (replicas * report["metric_variables"])
    assert report["reset_reduces_upstream"] == report["metric_variables"]


@pytest.mark.parametrize("replicas", [2, 4])
def test_a_generators_batches_train_as_one_device(replicas):
    """Two epochs of a generator yielding views of the user's arrays, in 64-byte-aligned memory
    (where NumPy puts large arrays): the same weights as one device, and the arrays untouched."""
    report = equivalence(replicas)
    assert report["generator_arrays_kept"]
    assert report["pydataset_arrays_kept"]  # kdist's PyDataset loader (plain Keras's wrote too)
    assert report["generator_max_weight_diff"] < 1e-5


@pytest.mark.parametrize("replicas", [2, 4])
def test_mirrored_writes_into_a_generators_arrays_upstream(replicas):
    """Without kdist's copy (fix generator_batches_copied), plain Keras + MirroredStrategy
    overwrites the arrays a generator yields views of, so a second pass trains on wrong data:
    TensorFlow 2.17 and 2.21; not on 2.22 (kdist copies there too: the copy is cheap)."""
    report = equivalence(replicas)
    tf_before_2_22 = version(report["tensorflow"]) < (2, 22, 0)
    assert report["generator_arrays_kept_upstream"] is not tf_before_2_22


@pytest.mark.parametrize("replicas", [2, 4])
def test_loss_scaling_bug_upstream_on_keras_before_3_8_only(replicas):
    """keras-team/keras#19891: without kdist's workaround, Keras < 3.8 applies N times the update
    (the per-replica gradients of the mean loss are summed); Keras >= 3.8 scales it itself."""
    report = equivalence(replicas)
    keras_before_3_8 = version(report["keras"]) < (3, 8, 0)
    assert report["loss_scaling_fix_active"] is keras_before_3_8
    if keras_before_3_8:
        assert report["unscaled_max_weight_diff"] > 1e-2  # the bug, upstream
    else:
        assert report["unscaled_max_weight_diff"] < 1e-5  # fixed upstream: kdist adds nothing
    assert report["max_weight_diff"] < 1e-5  # with kdist: exact on every version


@functools.lru_cache(maxsize=None)
@functools.cache  # one run serves both tests
def distributed_reads():
    return run_report(["tests/programs/distributed_reads.py"], timeout=240)


def test_what_keras_and_kdist_build_is_read_without_autotuning():
    """Fix distributed_reads_end_at_once: the datasets a strategy of several replicas reads for
    fit, evaluate and predict from arrays, generators and PyDatasets have no tf.data autotuning
    model (whose thread each deletion of the reader waited for); a user's tf.data keeps its own."""
    report = distributed_reads()
    assert report["replicas"] == 2
    assert report["autotuned"] == {"arrays, shuffled": [False], "arrays (evaluate)": [False],
                                   "generator": [False], "PyDataset": [False],
                                   "user's tf.data": [True]}
    # One dataset distributed for each iterator: Keras's, or the one a fix put in its place.
    assert report["distributions"] == dict.fromkeys(report["autotuned"], 1)
    # Each replica's own reader (TensorFlow's per-device dataset), whatever the input.
    assert report["per_device_autotuned"] == [False, False]
    assert report["per_device_autotuned_upstream"] == [True, True]


def test_fit_makes_one_iterator_per_epoch():
    """Fix one_iterator_per_epoch: a 3-epoch fit makes 3 distributed iterators over arrays, a
    PyDataset and a tf.data dataset of known size (upstream, Keras >= 3.7: 6, one at each epoch's
    end that the next epoch's start replaces unread); a generator with steps_per_epoch keeps one."""
    report = distributed_reads()
    known_size = ("arrays, shuffled", "arrays (evaluate)", "PyDataset", "user's tf.data")
    assert report["iterators"] == {**dict.fromkeys(known_size, 3), "generator": 1}, report
    upstream = 6 if report["makes_two"] else 3
    assert report["iterators_upstream"] == {**dict.fromkeys(known_size, upstream),
                                            "generator": 1}, report


def test_a_seeded_reshuffle_trains_one_devices_batches_epoch_after_epoch():
    """Fix one_iterator_per_epoch draws the seed of the iterator Keras leaves unread at each
    epoch's end: a dataset shuffled with a seed trains one device's global batches in every
    epoch, and in a second fit of the same dataset; with steps_per_epoch too. No element of the
    dataset is read more often than on one device."""
    report = distributed_reads()
    one_device = report["seeded_one_device"]["batches"]
    assert len(one_device) == 12 and one_device[:4] != one_device[4:8]  # reshuffled each epoch
    assert report["seeded"]["batches"] == one_device
    # With steps_per_epoch Keras reads the iterator made at an epoch's end in the next epoch.
    assert report["seeded_steps_per_epoch"]["batches"] == \
        report["seeded_steps_per_epoch_one_device"]["batches"] != one_device
    for run in ("seeded", "seeded_steps_per_epoch"):
        assert report[run]["reads"] <= report[f"{run}_one_device"]["reads"], report


def test_an_embeddings_replicas_stay_equal_with_repeated_ids():
    """Fix sparse_updates_merged_under_replicas: the step sums the rows of each repeated index
    before it scatters the update, so every replica's table is the same bit for bit; upstream
    each replica scatters the repeated rows in its threads' order (they drifted 3.7e-9 apart in
    2 epochs here, which kdist's replica check stops; how far varies from run to run)."""
    report = distributed_reads()
    assert report["sparse_update"] == {"replica_difference": 0.0, "merges_rows": True}
    assert report["sparse_update_upstream"]["merges_rows"] is False


def test_deleting_a_multi_device_iterator_waits_for_autotuning_upstream():
    """Upstream: deleting a MultiDeviceIterator over an autotuned dataset can wait for the
    autotuning thread's next wake-up (1 to 4 deletions in 16 waited 0.1-2.3 s here), and over a
    dataset without autotuning, for the thread of a device's own dataset (5 in 25, up to 1.25 s)."""
    report = distributed_reads()
    for upstream in (report["upstream"], report["upstream_per_device"]):
        assert upstream["wait_s"] is not None, f"no wait in {upstream['deletions']} deletions"
