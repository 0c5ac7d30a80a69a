"""Conformance: the idioms Keras users write (programs/idioms.py) train under Mirrored (2 logical
CPUs) and MultiWorkerMirrored (2 real workers) exactly as plain Keras on one device with the
global batch, with every replica and worker holding the same variables (random layers included:
each replica draws its rows of one device's draw); what cannot equal one device (per-replica
batch statistics) still agrees across replicas, and what cannot run is refused with the
reason."""

import concurrent.futures
import json
import os
import re
import sys

import keras
import numpy as np
import pytest

from conftest import ROOT, run_kdist, run_python
from kdist.keras_seam.versions import version


PROGRAM = os.path.join(ROOT, "tests", "conformance", "programs", "idioms.py")
MODES = ("mirrored", "multi_worker-worker0")
# Weights (and logs) equal one device's within float32 summation order; float16 within its own.
TOLERANCE = {"mixed_float16": 2e-3}
# Idioms that cannot equal one device, and why: the replicas must agree all the same.
NOT_ONE_DEVICE = {
    "batchnorm": "each replica normalizes with its own part of the batch (synchronized=True "
                 "uses the global batch)",
}
REFUSED = {
    "jit_compile": ("XLA cannot compile the gradient all-reduce on CPU", "jit_compile=False"),
    # kdist's replica check, on Keras's own BatchNormalization (kdist's fix removed)
    "diverging_replicas": ("the replicas disagree after epoch 1", "check_replicas='warn'"),
}
KERAS = version(keras.__version__)
if KERAS < (3, 16, 0):  # Keras 3.16 shuffles a PyDataset by the epoch's index, not by random
    NOT_ONE_DEVICE["pydataset_shuffled_unseeded"] = "Python's random is unseeded: one device " \
        "draws another order"
if KERAS < (3, 6, 0):  # kdist.keras_seam.inputs.PYDATASET_ORDERS
    for name in ("pydataset_shuffled", "pydataset_reshuffling_itself"):  # fit's shuffle=True
        NOT_ONE_DEVICE[name] = "Keras 3.5 shuffles a PyDataset's batches again with an " \
            "unseeded tf.data shuffle(8): one device's order cannot be drawn again"
if KERAS < (3, 7, 0):  # Keras <= 3.6 aborts the all-reduce at an epoch's end (kdist refuses)
    for name in ("steps_per_execution", "generator_to_its_end_in_executions"):
        REFUSED[name] = ("Keras <= 3.6 aborts the gradient all-reduce", "steps_per_execution=1")
# Keras < 3.8 under Mirrored: kdist leaves Keras's equal replica weights (kdist.wiring.keras_hooks.
# _weighs_examples), so a short last batch weighs examples as plain tf.distribute does.
# timeseries_reshuffled: 115 windows in batches of 16 end with a batch of 3 (2.3e-4 off on
# Keras 3.5, shuffled or not).
NOT_ONE_DEVICE_MIRRORED = dict.fromkeys(
    ("uneven_last_batch", "uneven_last_batch_weighted", "one_row_last_batch", "empty_share",
     "empty_share_broadcasting_loss", "random_layers_uneven", "add_loss_mean",
     "timeseries_reshuffled")
    if KERAS < (3, 8, 0) else (), "Keras < 3.8 under Mirrored: a short last batch weighs "
    "examples as plain tf.distribute does (kdist.wiring.keras_hooks._weighs_examples)")
if KERAS < (3, 8, 0):  # kdist's fix additional_loss_sums_as_one_device targets Keras >= 3.8
    NOT_ONE_DEVICE["add_loss_sum"] = "Keras < 3.8: a loss given to add_loss is divided by the " \
        "replicas with the rest of the loss, a sum over the batch included"
if KERAS < (3, 14, 0):  # keras-team/keras#22018, fixed in Keras 3.14
    NOT_ONE_DEVICE["activity_regularizer"] = "Keras < 3.14 does not divide the activity loss by " \
        "the batch size, so its strength depends on each replica's batch"
CUSTOM_STEPS = ("custom_train_step", "custom_train_step_loss_object", "gan_two_optimizers",
                "gan_noise_drawn_in_step")
# What each upstream bug does with kdist's fix removed (programs/idioms.py's upstream mode).
UPSTREAM = ("batchnorm", "clipnorm_sgd", "global_clipnorm_sgd", "clipvalue_sgd",
            "gradient_accumulation_sgd", "custom_train_step", "mixed_float16", "gan_two_optimizers",
            "dropout", "random_layers_uneven", "add_loss_sum")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("idioms")

    def run(mode):  # each mode alone in its process, the three side by side (no timing here)
        return run_python([PROGRAM, mode, str(out), *([",".join(UPSTREAM)] if mode ==
                                                      "upstream" else [])], timeout=360)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        for result in pool.map(run, ("one_device", "mirrored", "upstream")):
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    result = run_kdist(["launch", "--workers", "2", "--timeout", "300", "--", sys.executable,
                        PROGRAM, "multi_worker", str(out)], timeout=330)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def report(out, mode):
    return json.load(open(out / f"{mode}.json"))


def weights(out, mode, idiom):
    return np.load(out / mode / f"{idiom}.npz")


IDIOMS = [  # the program's list (checked below; importing it would start TensorFlow's runtime)
    "batchnorm", "batchnorm_synchronized", "clipnorm_sgd", "global_clipnorm_sgd", "clipvalue_sgd",
    "clipnorm_adam", "gradient_accumulation_sgd", "gradient_accumulation_adam", "regularizers",
    "activity_regularizer", "adamw", "learning_rate_schedule", "steps_per_execution", "ema", "mixed_float16",
    "sample_weight", "classification_metrics", "multi_output", "dropout", "random_layers_uneven",
    "add_loss_sum", "add_loss_mean", "custom_train_step", "custom_train_step_loss_object", "gan_two_optimizers",
    "gan_noise_drawn_in_step", "vae", "diverging_replicas",
    "jit_compile", "embedding_sgd", "position_embedding_adam", "gather_dense_unused_adam",
    "uneven_last_batch", "uneven_last_batch_weighted", "one_row_last_batch", "empty_share",
    "empty_share_broadcasting_loss", "pydataset",
    "pydataset_two_workers", "pydataset_shuffled", "pydataset_shuffled_unseeded",
    "generator_steps_per_epoch", "generator_to_its_end",
    "generator_to_its_end_in_executions", "numpy_shuffled", "numpy_shuffled_by_batch",
    "tfdata_reshuffled", "image_folder_reshuffled", "text_folder_reshuffled",
    "adapted_columns_reshuffled", "timeseries_reshuffled", "pydataset_reshuffling_itself"]


def test_the_idiom_list_is_the_programs(runs):
    assert list(report(runs, "one_device")) == IDIOMS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("idiom", [i for i in IDIOMS if i not in REFUSED])
def test_every_replica_and_worker_holds_the_same_variables(runs, idiom, mode):
    outcome = report(runs, mode)[idiom]
    assert outcome["ok"], outcome.get("trace", "")
    assert outcome["replica_difference"] == 0.0, outcome["replica_difference_at"]
    if mode.startswith("multi_worker"):
        first, second = weights(runs, mode, idiom), weights(runs, "multi_worker-worker1", idiom)
        assert first.files == second.files
        assert all(np.array_equal(first[k], second[k]) for k in first.files)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("idiom", [i for i in IDIOMS if i not in REFUSED and i not in NOT_ONE_DEVICE])
def test_training_equals_one_device_with_the_global_batch(runs, idiom, mode):
    if mode == "mirrored" and idiom in NOT_ONE_DEVICE_MIRRORED:
        pytest.skip(NOT_ONE_DEVICE_MIRRORED[idiom])
    if idiom in CUSTOM_STEPS and version(keras.__version__) < (3, 8, 0):
        pytest.skip("Keras < 3.8 does not scale a custom train_step's loss for the replicas: "
                    "kdist warns (test_a_custom_train_step_is_warned_about_on_keras_before_3_8)")
    tolerance = TOLERANCE.get(idiom, 1e-5)
    one, other = report(runs, "one_device")[idiom], report(runs, mode)[idiom]
    assert one["ok"] and other["ok"], other.get("trace", "")
    expected, got = weights(runs, "one_device", idiom), weights(runs, mode, idiom)
    assert expected.files == got.files
    for name in expected.files:
        np.testing.assert_allclose(got[name], expected[name], atol=tolerance, rtol=tolerance,
                                   err_msg=f"{idiom}: {name}")
    assert other["history"].keys() >= one["history"].keys()
    for key, values in one["history"].items():
        np.testing.assert_allclose(other["history"][key], values, rtol=tolerance * 10,
                                   atol=tolerance, err_msg=f"{idiom}: logged {key}")
    for key, value in one["evaluate"].items():
        assert other["evaluate"][key] == pytest.approx(value, rel=tolerance * 10, abs=tolerance), \
            f"{idiom}: evaluate {key}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("idiom", sorted(REFUSED))
def test_what_cannot_run_is_refused_with_the_reason(runs, idiom, mode):
    outcome = report(runs, mode)[idiom]
    reason, way_out = REFUSED[idiom]
    assert not outcome["ok"] and reason in outcome["error"] and way_out in outcome["error"]


@pytest.mark.parametrize("mode,other", [("mirrored", "replica 1 (CPU:1)"),
                                        ("multi_worker-worker0", "replica 1 (worker:1)"),
                                        ("multi_worker-worker1", "replica 1 (worker:1)")])
def test_the_replica_check_names_the_variable_the_replicas_and_the_difference(runs, mode, other):
    error = report(runs, mode)["diverging_replicas"]["error"]
    assert re.search(rf"batch_normalization(_\d+)?/moving_mean: replica 0 and {re.escape(other)} "
                     r"differ by up to \d", error), error


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("idiom", sorted(NOT_ONE_DEVICE))
def test_what_cannot_equal_one_device_still_trains(runs, idiom, mode):
    outcome = report(runs, mode)[idiom]
    assert outcome["ok"] and outcome["history"]["loss"][-1] < outcome["history"]["loss"][0]


@pytest.mark.parametrize("mode", MODES)
def test_per_replica_batch_statistics_are_said_once_per_model(runs, mode):
    """kdist says which BatchNormalization layers normalize each replica's share on its own (and
    the switch), once per model; never for synchronized ones."""
    for idiom, said in (("batchnorm", 1), ("batchnorm_synchronized", 0), ("dropout", 0)):
        lines = [w for w in report(runs, mode)[idiom]["warnings"]
                 if "BatchNormalization layer(s) of" in w]
        assert len(lines) == said, (idiom, lines)
        if said:
            assert "synchronized=True" in lines[0] and "2 replicas" in lines[0], lines


@pytest.mark.parametrize("mode", MODES)
def test_a_step_that_needs_the_global_rows_says_its_collective_once_per_model(runs, mode):
    """Where a replica's rows start (draws) and how many the global batch holds (an add_loss
    sum) take an all-gather of the batch sizes in every step: said once per model (fit and
    evaluate), with what needs it and, for draws, the way back to Keras's; never for a model
    that needs neither, nor for batches of a static size (the GAN's drop_remainder=True)."""
    sums = 1 if KERAS >= (3, 8, 0) else 0  # the fix of add_loss sums targets Keras >= 3.8
    for idiom, said in (("random_layers_uneven", 1), ("gan_noise_drawn_in_step", 0),
                        ("uneven_last_batch", 0), ("add_loss_sum", sums), ("add_loss_mean", 0)):
        lines = [w for w in report(runs, mode)[idiom]["warnings"]
                 if "takes one all-gather of the replicas' batch sizes" in w]
        assert len(lines) == said, (idiom, lines)
    [draws] = [w for w in report(runs, mode)["random_layers_uneven"]["warnings"]
               if "all-gather" in w]
    assert "each of the 2 replicas draws its rows" in draws, draws
    assert "patch('random_draws_as_one_device').uninstall()" in draws, draws
    for line in [w for w in report(runs, mode)["add_loss_sum"]["warnings"] if "all-gather" in w]:
        assert "a loss given to add_loss sums over the batch" in line, line


@pytest.mark.parametrize("mode", MODES)
def test_an_unseeded_pydataset_shuffle_is_said_once_where_the_workers_differ(runs, mode):
    """Where Keras shuffles by Python's random (3.6-3.15), workers whose random differ at fit's
    start (unseeded) take a shared seed's order and say so; a seeded program's workers agree,
    take one device's order and say nothing. Keras 3.16 shuffles by the epoch's index: nothing
    to say."""
    def said(idiom):
        return [w for w in report(runs, mode)[idiom]["warnings"]
                if "Python random states differ" in w]

    assert said("pydataset_shuffled") == []
    lines = said("pydataset_shuffled_unseeded")
    if mode.startswith("multi_worker") and (3, 6, 0) <= KERAS < (3, 16, 0):
        assert len(lines) == 1 and "keras.utils.set_random_seed(n)" in lines[0], lines
    else:  # one process: Keras's own draw, whatever its state
        assert lines == []


def _furthest(out, mode, idiom) -> float:
    """By position: an optimizer slot's name carries counters that depend on what ran before."""
    expected, got = weights(out, "one_device", idiom), weights(out, mode, idiom)
    assert len(expected.files) == len(got.files), (expected.files, got.files)
    return max(float(np.abs(got[k] - expected[j]).max())
               for j, k in zip(sorted(expected.files), sorted(got.files)))


def test_the_upstream_bugs_still_need_kdists_fixes(runs):
    """Regression evidence for the fixes of kdist/keras_seam/one_device_fixes.py: with them removed,
    Keras as shipped still breaks each idiom under 2 replicas. When one of these passes, upstream
    fixed the bug: give the fix its fixed_in."""
    upstream, one = report(runs, "upstream"), report(runs, "one_device")
    assert upstream["batchnorm"]["replica_difference"] > 1e-4
    for idiom in ("clipnorm_sgd", "global_clipnorm_sgd", "clipvalue_sgd"):
        assert _furthest(runs, "upstream", idiom) > 1e-3, idiom
    assert "merge_call" in upstream["gradient_accumulation_sgd"]["error"]
    assert "Unable to automatically build the model" in upstream["gan_two_optimizers"]["error"]
    for idiom in ("dropout", "random_layers_uneven"):  # every replica draws the same numbers
        assert _furthest(runs, "upstream", idiom) > 1e-3, idiom
    if version(keras.__version__) >= (3, 8, 0):  # Keras divides an add_loss sum by the replicas
        assert _furthest(runs, "upstream", "add_loss_sum") > 1e-4
    assert not np.isfinite(_furthest(runs, "upstream", "mixed_float16")) or \
        _furthest(runs, "upstream", "mixed_float16") > 1e-2
    logged = upstream["custom_train_step"]["history"]["loss"][-1]
    expected = one["custom_train_step"]["history"]["loss"][-1]
    if version(keras.__version__) >= (3, 8, 0):  # Keras divides the value by the replicas
        assert logged == pytest.approx(expected / 2, rel=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_a_custom_train_step_is_warned_about_on_keras_before_3_8(runs, mode):
    """Keras < 3.8 divides no loss by the replicas: kdist divides the stock train_step's and
    says, once per model, that a custom one must divide its own. From 3.8 Keras's loss objects
    and compute_loss divide it: kdist says it once per model only for a train_step that
    differentiated no such loss (the VAE's, which divides its own mean: kdist cannot tell)."""
    before = version(keras.__version__) < (3, 8, 0)
    for idiom in ("custom_train_step", "gan_two_optimizers", "classification_metrics", "vae"):
        warned = [w for w in report(runs, mode)[idiom]["warnings"]
                  if "overrides train_step" in w or "did not divide" in w]
        custom = idiom != "classification_metrics" and before or idiom == "vae"
        assert len(warned) == (1 if custom else 0), (idiom, warned)
        if custom:
            assert "num_replicas_in_sync" in warned[0]
        if idiom == "vae" and not before:
            assert warned[0].startswith("kdist: VAE.train_step differentiates a loss that Keras "
                                        "did not divide by the 2 replicas"), warned

