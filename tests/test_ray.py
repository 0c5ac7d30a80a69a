"""kdist inside Ray Train: a real local Ray cluster (loopback, no dashboard) running
`TensorflowTrainer` jobs of 2 workers, one of them SIGKILLed mid-epoch (tests/programs/ray_job.py)."""

import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import psutil
import pytest

from conftest import PROGRAMS, QUIET_TF, ROOT, scaled


@pytest.fixture(scope="module")
def ray_temp_dir():
    """Ray's session directory (short: it holds Unix sockets); every process whose command line
    names it is killed afterwards, whatever became of the driver."""
    folder = tempfile.mkdtemp(prefix="kray", dir="/tmp")
    yield folder
    left = [p for p in psutil.process_iter(["cmdline"]) if folder in " ".join(p.info["cmdline"] or [])]
    for process in left:
        process.kill()
    subprocess.run(["rm", "-rf", folder], check=False)
    assert not left, f"Ray processes left running: {[p.info['cmdline'][:3] for p in left]}"


@pytest.fixture(scope="module")
def ray_jobs(tmp_path_factory, ray_temp_dir):
    """One Ray cluster, two TensorflowTrainer jobs (tests/programs/ray_job.py): rank 1 SIGKILLed
    after step 12 of epoch 1 on the first attempt, Ray restarting the group once."""
    out = tmp_path_factory.mktemp("ray")
    result = subprocess.run([sys.executable, os.path.join(PROGRAMS, "ray_job.py"), str(out),
                             ray_temp_dir, "--kill-at-step", "12"], cwd=ROOT, capture_output=True,
                            text=True, timeout=scaled(400), env={**os.environ, **QUIET_TF})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"ray.init {report['ray_init_seconds']:.1f} s, fit " +
          ", ".join(f"{name} {job['fit_seconds']:.1f} s" for name, job in report["jobs"].items()))
    return out, report


def starts_of(folder):
    """Each worker's first trained step per attempt."""
    return [json.loads(line) for line in (folder / "first-steps.jsonl").read_text().splitlines()]


STEPS_PER_EPOCH = -(-1437 // 64)  # the UCI digits' training split, global batch 2 x 32


@pytest.mark.parametrize("job", ["with_backup", "ray_only"])
def test_tensorflow_trainer_reports_each_epoch_once_and_completes_after_a_kill(ray_jobs, job):
    """The two lines inside Ray's train loop: MultiWorkerMirrored from Ray's TF_CONFIG; every
    epoch's metrics reported once and its checkpoint written once, as kdist writes it; Ray started
    the group twice; both workers end with the same weights, and the run learnt."""
    out, report = ray_jobs
    result = report["jobs"][job]
    assert result["error"] is None and result["metrics"]["epoch"] == 2
    assert [c["metrics"]["epoch"] for c in result["checkpoints"]] == [0, 1, 2]
    assert all(c["files"] == ["manifest.json", "model.weights.h5"] for c in result["checkpoints"])
    starts = starts_of(out / job)
    assert sorted((s["rank"], s["attempt"]) for s in starts) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    weights = [np.load(out / job / f"weights-{rank}.npy") for rank in (0, 1)]
    assert np.array_equal(*weights)
    # 3 epochs of 23 steps: 0.90-0.91 measured uncompressed, 0.82-0.90 with PowerSGD rank 4
    assert float((out / job / "accuracy-0").read_text()) >= (0.85 if job == "ray_only" else 0.75)


def test_ray_checkpoint_alone_resumes_at_the_epoch(ray_jobs):
    """Without a backup, `ReportCheckpoint` restores Ray's latest checkpoint: epoch 1 from its
    first step, with epoch 0's optimizer state."""
    out, _ = ray_jobs
    for start in (s for s in starts_of(out / "ray_only") if s["attempt"] == 1):
        assert (start["epoch"], start["step"], start["iterations"]) == (1, 0, STEPS_PER_EPOCH)


def test_step_level_backup_overrides_the_epoch_checkpoint(ray_jobs):
    """With kdist's BackupAndRestore(save_freq=5) after it, the restart resumes at the backup's
    step (35 optimizer steps: 1 of the 13 trained in epoch 1 is lost), not at the epoch."""
    out, _ = ray_jobs
    for start in (s for s in starts_of(out / "with_backup") if s["attempt"] == 1):
        assert (start["epoch"], start["step"], start["iterations"]) == (1, 12, STEPS_PER_EPOCH + 12)


def test_ray_example_trains_on_a_local_ray_cluster(tmp_path, ray_temp_dir):
    result = subprocess.run([sys.executable, "examples/ray_mnist.py", "--data=digits", "--epochs=2",
                             f"--storage={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=scaled(300), env={**os.environ, **QUIET_TF,
                                                      "RAY_TMPDIR": ray_temp_dir})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    accuracy = re.search(r"uci_digits: test accuracy ([0-9.]+) after 2 epochs on 2 Ray workers",
                         result.stdout + result.stderr)
    assert accuracy and float(accuracy.group(1)) >= 0.85, result.stdout[-3000:]
    assert "'epoch': 1" in result.stdout  # Ray's final metrics: the last epoch reported


def test_kdist_never_imports_ray():
    code = "import sys, kdist, kdist.callbacks; print('ray' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=scaled(120), env={**os.environ, **QUIET_TF})
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_report_checkpoint_rejects_a_bad_frequency():
    from kdist.integrations.ray import ReportCheckpoint

    with pytest.raises(ValueError, match="checkpoint_every=-1"):
        ReportCheckpoint(checkpoint_every=-1)


def test_a_damaged_ray_checkpoint_is_refused_naming_it(ray_jobs, tmp_path):
    """A Ray checkpoint is a `kdist.fault_tolerance.backup` unit: `ReportCheckpoint` verifies it
    before restoring (`backup.verify`, the call its on_train_begin makes), so a damaged one stops
    the run with its path instead of resuming from other state."""
    import shutil

    import keras

    from kdist.fault_tolerance import backup

    out, report = ray_jobs
    saved = report["jobs"]["ray_only"]["checkpoints"][-1]["path"]
    copy = tmp_path / "checkpoint"
    shutil.copytree(saved, copy)
    model = keras.Sequential([keras.Input((8, 8)), keras.layers.Flatten(),  # ray_job.py's
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(2e-3), "mse")
    assert backup.verify(str(copy), backup.architecture(model)).manifest["epoch"] == 3
    weights = copy / backup.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[len(data) * 3 // 5: len(data) * 3 // 5 + 512] = bytes(512)  # 512 zero bytes at 60%
    weights.write_bytes(bytes(data))
    with pytest.raises(backup.BackupError, match=rf"backup {copy}: model.weights.h5 differs from "
                                                 r"what was saved \(SHA-256 mismatch\)"):
        backup.verify(str(copy), backup.architecture(model))
