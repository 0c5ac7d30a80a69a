"""`kdist.check_replicas` and the end-of-epoch check (kdist/replicas.py) under MirroredStrategy on
2 logical CPUs; the 2-worker case (the replicas named by task) is in tests/conformance/test_idioms.py.
The model's BatchNormalization runs without kdist's fix, as Keras ships it, so its statistics
drift apart between the replicas."""

import pytest

import kdist
from conftest import run_report
from kdist.wiring.options import TrainingOptions


@pytest.fixture(scope="module")
def report():
    return run_report(["tests/programs/replica_check.py"], timeout=240)


def test_fit_stops_after_the_first_epoch_naming_the_statistics_by_default(report):
    assert "the replicas disagree after epoch 1" in report["error"]["error"]
    assert [v.split("/")[-1] for v in report["error"]["variables"]] == ["moving_mean",
                                                                        "moving_variance"]
    assert "replica 0 and replica 1 (CPU:1) differ by up to" in report["error"]["error"]


def test_warn_trains_on_and_says_it_at_every_epoch(report):
    assert report["warn"]["epochs"] == 2
    assert [w.split(":")[1] for w in report["warn"]["warnings"]] == \
        [" the replicas disagree after epoch 1", " the replicas disagree after epoch 2"]


def test_off_is_silent(report):
    assert report["off"] == {"epochs": 2, "warnings": []}


def test_on_demand_it_returns_what_differs_and_nothing_for_a_healthy_model(report):
    assert report["on_demand"] == [["moving_mean", ["replica 1 (CPU:1)"], True],
                                   ["moving_variance", ["replica 1 (CPU:1)"], True]]
    assert report["healthy"] == []


def test_one_replica_has_nothing_to_compare():
    import keras

    with kdist.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert kdist.check_replicas(model) == []


@pytest.mark.parametrize("value", ["always", True, None])
def test_a_bad_mode_is_refused_naming_the_option(value):
    with pytest.raises(ValueError, match="check_replicas: .* is not a mode. Fix: use 'error'"):
        TrainingOptions.parse(check_replicas=value)
