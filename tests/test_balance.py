"""`kdist.scope(balance=...)`: proportional batches for uneven replicas, checked numerically
against plain Keras with the global batch, under Mirrored (2 logical CPUs) and MultiWorkerMirrored
(2 real workers, one in a CPU cgroup capped at 20% of a core)."""

import json
import sys

import pytest

from conftest import run_kdist, run_python


@pytest.fixture(scope="module")
def mirrored_report(tmp_path_factory):
    """One fresh process (the CPU is split before TF starts), shared by the tests below."""
    out = tmp_path_factory.mktemp("balance")
    result = run_python(["tests/programs/balance_job.py", "mirrored", str(out)], timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return json.load(open(out / "mirrored-0.json"))


def assert_equals_plain_keras(run):
    assert run["training_change"] > 1e-2  # the weights moved...
    assert run["max_weight_diff"] < 1e-6  # ...exactly as plain Keras's global-batch SGD
    assert run["loss"] == pytest.approx(run["reference_loss"], rel=1e-5)
    assert run["accuracy"] == pytest.approx(run["reference_accuracy"], abs=1e-6)


def test_fixed_shares_split_every_batch_and_train_like_the_global_batch(mirrored_report):
    fixed = mirrored_report["fixed"]
    assert mirrored_report["replicas"] == 2
    assert fixed["shares"] == [0.75, 0.25]
    assert fixed["seen"] == fixed["expected_seen"] == [528, 192]  # 3:1, partial batch included
    assert_equals_plain_keras(fixed)


def test_measured_shares_train_like_the_global_batch(mirrored_report):
    measured = mirrored_report["measured"]
    assert sum(measured["shares"]) == pytest.approx(1.0)
    assert all(share > 0 for share in measured["shares"])
    assert measured["seen"] == measured["expected_seen"]  # measuring trains on nothing
    assert_equals_plain_keras(measured)


def test_what_cannot_be_balanced_is_refused_with_the_fix(mirrored_report):
    assert "aggregate_every" in mirrored_report["refused_aggregate_every"]
    assert mirrored_report["refused_length"] == (
        'balance: [1, 1, 1] gives 3 shares for 2 replicas. Fix: give one share per replica '
        '(replica_id_in_sync_group order), or balance="measure"')


@pytest.mark.parametrize("value, problem", [
    ("fast", "'fast' is neither 'measure' nor a list of shares"),
    (3, "3 is neither 'measure' nor a list of shares"),
    ([2, 0], "[2, 0] is not a list of positive numbers"),
    ([], "[] is not a list of positive numbers"),
    ([1, True], "[1, True] is not a list of positive numbers"),
])
def test_bad_balance_values_name_the_field_and_the_fix(value, problem):
    from kdist.balance import Balance

    with pytest.raises(ValueError) as error:
        Balance.parse(value)
    assert str(error.value) == f'balance: {problem}. Fix: give one share per replica ' \
                               '(replica_id_in_sync_group order), or balance="measure"'


def test_two_workers_one_slow_measure_shares_and_train_exactly(tmp_path, slow_cpu_cgroup):
    result = run_kdist(["launch", "--workers", "2", "--timeout", "200", "--", sys.executable,
                        "tests/programs/balance_job.py", "workers", str(tmp_path)], timeout=230,
                       env={"KDIST_TEST_CGROUP": slow_cpu_cgroup})
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    chief, slow = (json.load(open(tmp_path / f"workers-{t}.json")) for t in (0, 1))
    assert chief["strategy"] == "CollectiveAllReduceStrategy" and chief["replicas"] == 2
    shares = chief["measured"]["shares"]
    assert shares == slow["measured"]["shares"]  # both workers split alike
    assert shares[1] < 0.4  # the capped worker measured slower and takes less of each batch
    assert chief["measured"]["seen"] == chief["measured"]["expected_seen"]
    assert_equals_plain_keras(chief["measured"])
