"""`kdist verify` (kdist/cli/verify.py, kdist/wiring/verify.py) on a user's program with 2 real
workers: the distributed first steps against the same global batches on one device, for sparse
gradients, a short last batch, NumPy arrays and a tf.data dataset of dict features with sample
weights; a planted wrong sum that every worker agrees on is found and named."""

import json
import sys

import numpy as np
import pytest

from conftest import run_kdist

PROGRAM = [sys.executable, "tests/programs/verify_job.py"]
ROWS = 69  # the program's rows: 4 global batches of 16, and 5 rows (3 and 2) in the last


def verify(tmp_path, env=None, steps=5):
    result = run_kdist(["verify", "--workers", "2", "--steps", str(steps), "--timeout", "240",
                        "--keep", str(tmp_path), "--", *PROGRAM], timeout=540, env=env)
    report = tmp_path / "report.json"
    return result, json.loads(report.read_text()) if report.exists() else None


@pytest.mark.parametrize("source", ["numpy", "tfdata"])
def test_a_program_that_trains_as_one_device_is_verified(tmp_path, source):
    """With NumPy arrays the model has a Dropout layer: each replica draws its rows of one
    device's masks (with every replica drawing the same masks, 0.0197 apart at the first step)."""
    result, report = verify(tmp_path, env={"INPUT": source, "DROPOUT": "1" if source == "numpy"
                                           else ""})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert "kdist verify: the same training as one device" in result.stdout
    assert "the program went on after fit" not in result.stdout  # both runs end after the steps
    # the model's 4 weights against one device; with Adam's 10 (2 slots for each, its iterations,
    # its learning rate) across the workers
    assert report["steps"] == 5 and report["replicas"] == 2 and report["weights"] == 4
    assert report["variables"] == 14
    assert report["workers"] == ["worker:0", "worker:1"]
    assert report["one_device"]["first_differing"] is None
    assert report["workers_agree"]["largest"]["difference"] == 0.0
    # The five global batches replayed are the epoch's 69 rows, each once, the last one short
    # (a prefetched tf.data pipeline drew its shuffle's seeds racily: kdist.keras_seam.inputs).
    shares = [np.load(tmp_path / f"batches-worker-{w}.npz") for w in (0, 1)]
    rows = [shares[w][f"s{s}_r{w}_l0"] for s in range(5) for w in (0, 1)]
    assert [len(r) for r in rows] == [8] * 8 + [3, 2]
    x = np.random.default_rng(0).integers(0, 40, (ROWS, 6))
    assert sorted(map(tuple, np.concatenate(rows))) == sorted(map(tuple, x))


@pytest.mark.parametrize("cell", [
    {"EXCHANGE": "collectives"}, {"EXCHANGE": "buckets"}, {"EXCHANGE": "aggregate"},
    {"ROWS": "65"}, {"ROWS": "65", "EXCHANGE": "buckets"}],
    ids=["tensorflow-collectives", "buckets", "aggregate_every-2", "empty-share",
         "empty-share-buckets"])
def test_every_exchange_path_and_share_trains_as_one_device(tmp_path, cell):
    """The matrix's cells on 2 real workers: sparse gradients with repeated ids, a variable
    without a gradient and a short last batch (69 rows: 3/2; 65 rows: 1/0, an empty share) on
    each exchange path, against one device through kdist verify."""
    result, report = verify(tmp_path, env=cell)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert report["one_device"]["first_differing"] is None, report
    assert report["workers_agree"]["largest"]["difference"] == 0.0


@pytest.mark.parametrize("source", ["generator", "pydataset1", "pydataset2", "tfrecord"])
def test_every_input_trains_as_one_device(tmp_path, source):
    """The inputs users bring, on 2 real workers against one device: a Python generator, a
    PyDataset with 1 and 2 loader threads (shuffled by fit) and one TFRecord file (sharded by
    data); the five global batches replayed are the epoch's 69 rows, each once."""
    result, report = verify(tmp_path, env={"INPUT": source, "RECORDS": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert report["one_device"]["first_differing"] is None, report
    assert report["workers_agree"]["largest"]["difference"] == 0.0
    shares = [np.load(tmp_path / f"batches-worker-{w}.npz") for w in (0, 1)]
    steps = [[shares[w][f"s{s}_r{w}_l0"] for w in (0, 1)] for s in range(5)]
    assert sorted([len(a), len(b)] for a, b in steps) == [[3, 2]] + [[8, 8]] * 4
    x = np.random.default_rng(0).integers(0, 40, (ROWS, 6))
    assert sorted(map(tuple, np.concatenate(sum(steps, [])))) == sorted(map(tuple, x))


def test_a_one_row_share_trains_as_one_device(tmp_path):
    """66 rows: the last global batch has 2 rows, one for each worker."""
    result, report = verify(tmp_path, env={"ROWS": "66"})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert report["one_device"]["first_differing"] is None, report
    shares = [np.load(tmp_path / f"batches-worker-{w}.npz") for w in (0, 1)]
    assert [len(shares[w]["s4_r%d_l0" % w]) for w in (0, 1)] == [1, 1]


def test_a_wrong_sum_every_worker_agrees_on_is_found_and_named(tmp_path):
    """Half of the Embedding's summed gradient counted twice on every worker: the replica check
    cannot see it (the workers agree); verify names the variable, well beyond the tolerance, and
    beyond the rounding allowance of a model computed in bfloat16 (which does not hide it)."""
    result, report = verify(tmp_path, env={"PLANT": "1", "POLICY": "mixed_bfloat16"})
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-3000:]
    assert "kdist verify: DIFFERENT from one device" in result.stdout
    assert report["workers_agree"]["first_differing"] is None
    first = report["one_device"]["first_differing"]
    assert first["variable"].endswith("embedding/embeddings"), first
    assert 0 < first["allowance"] < abs(first["value"] - first["expected"]) / 5, first
    assert "first variable that differs: " + first["variable"] in result.stdout


def test_a_loss_not_divided_by_the_replicas_is_said_and_named_by_its_update_ratio(tmp_path):
    """A train_step of the user's reducing its loss with a mean (keras.io's VAE's way), SGD: each
    worker says once, at the step's trace, that Keras did not divide that loss; verify finds the
    update 2x one device's and names that cause."""
    result, report = verify(tmp_path, env={"OWN_LOSS": "1"})
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-3000:]
    # 2x at every step: each starts from the distributed run's state
    assert report["one_device"]["first_differing"]["update_ratio"] == pytest.approx(2, rel=0.05)
    assert "x one device's: as when a loss is not divided by the 2 replicas" in result.stdout
    said = [line for line in (result.stdout + result.stderr).splitlines()
            if "OwnLoss.train_step differentiates a loss that Keras did not divide" in line]
    assert sorted(line.split("]")[0] for line in said) == ["[worker-0", "[worker-1"], said


def test_per_replica_batch_statistics_are_said_at_the_first_fit_and_by_verify(tmp_path):
    """A BatchNormalization layer normalizes each replica's share with its own statistics, which
    one device cannot: each worker says so once at its first fit, and verify names the layer as
    the expected difference, with the switch that makes it exact."""
    result, report = verify(tmp_path, env={"BATCHNORM": "1"})
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-3000:]
    assert report["per_replica_statistics"] == ["per_replica_norm"]
    assert "expected: 1 BatchNormalization layer(s) (per_replica_norm) normalize each " \
           "replica's share with its own statistics" in result.stdout
    said = [line for line in (result.stdout + result.stderr).splitlines()
            if "BatchNormalization layer(s) of" in line and "(per_replica_norm)" in line]
    assert sorted(line.split("]")[0] for line in said) == ["[worker-0", "[worker-1"], said


def test_a_model_computed_in_bfloat16_is_judged_with_its_rounding_allowance(tmp_path):
    """Under mixed_bfloat16 two replicas round their half batches differently from one device:
    within one step here 6.9e-6 and 9.4e-6 apart in two runs, a hundred times float32's exact
    path (1e-8) and at float32's tolerance, beyond it at times (compared from one start only, 4e-5
    after 5 steps). Verify allows 8 roundoffs of bfloat16 times the step's largest move of a
    weight on one device, and says so. (Scaled by each variable's own move, a CI run failed: a
    Dense kernel whose gradient nearly cancelled moved 1.2e-4 in Adam's third step and parted by
    3.3e-5, as Adam turns a gradient's rounding into a move of the order of its learning rate.)"""
    result, report = verify(tmp_path, env={"POLICY": "mixed_bfloat16"})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert report["bounds"] == {"policy": "mixed_bfloat16", "compute_dtype": "bfloat16",
                                "per_move": 8 * 2 ** -8}
    assert report["one_device"]["largest"]["difference"] > 1e-6  # bfloat16's rounding, not 1e-8
    assert "0.0312 of the step's largest move of a weight on one device, as the policy " \
           "mixed_bfloat16 computes in bfloat16" in result.stdout


def test_a_lossy_compressor_is_named_as_the_expected_difference(tmp_path):
    """fp16 compression cannot train as one device does: verify shows by how much, and says why."""
    result, report = verify(tmp_path, env={"EXCHANGE": "fp16"})
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-3000:]
    assert report["lossy"].startswith("FP16(") and report["one_device"]["first_differing"]
    assert report["workers_agree"]["first_differing"] is None
    assert "expected: the gradients are compressed with FP16(" in result.stdout


def test_a_program_without_fit_and_a_bad_flag_are_refused_with_the_fix(tmp_path):
    result = run_kdist(["verify", "--workers", "2", "--timeout", "120", "--", sys.executable,
                        "-c", "import kdist"], timeout=240)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "the program ended without calling model.fit" in result.stderr
    result = run_kdist(["verify", "--steps", "0", "--", sys.executable, "-c", "pass"], timeout=60)
    assert result.returncode == 2 and "--steps: '0' is out of range" in result.stderr


def test_a_one_device_run_past_its_timeout_shows_where_it_waits(tmp_path):
    """The one-device run is asked for its threads' stacks before it is killed at --timeout.
    Written `--timeout=45`, the timeout is not scaled by the machine's load as run_kdist scales
    `--timeout N` (CI: 145 s of waiting for a stall that never ends); 45 s leave a loaded machine
    the time to import TensorFlow and reach the stall."""
    result = run_kdist(["verify", "--workers", "2", "--timeout=45", "--keep", str(tmp_path),
                        "--", *PROGRAM], timeout=240, env={"STALL_ALONE": "1"})
    assert result.returncode == 124, result.stdout[-4000:] + result.stderr[-3000:]
    assert "the one-device run took more than" in result.stderr  # run_kdist may lengthen it
    stack = [line for line in result.stdout.splitlines() if "in stalled_alone" in line]
    assert stack and stack[0].startswith("[one-device]"), result.stdout[-4000:]


def test_a_chaotic_run_exact_at_every_step_is_verified(tmp_path):
    """SGD(1.0) on a ReLU network: rounding grows over steps (CI once saw a 4-step run of the
    Conv2D port 5.07e-05 apart from one start). Each step starts from the distributed run's state,
    so only one step's rounding is compared, over 64 steps and an epoch's end."""
    result = run_kdist(["verify", "--workers", "2", "--steps", "64", "--timeout", "240",
                        "--keep", str(tmp_path), "--", sys.executable,
                        "tests/programs/chaotic_job.py"], timeout=540)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == 64 and report["one_device"]["excess"] < 0.1, report
