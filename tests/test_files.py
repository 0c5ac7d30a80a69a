"""Every file a user's program writes is whole, and no two writers collide on a path: 2 real
workers sharing one folder (tests/programs/files_job.py), a save that fails midway, a full
disk."""

import gc
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import run_kdist
from kdist.keras_seam import patches


WRITTEN = ["best.weights.h5", "epoch-1.keras", "epoch-2.keras", "epoch-3.keras", "exported",
           "log.csv", "model.keras", "model.weights.h5", "tensorboard", "worker-0.weights.h5",
           "worker-1.weights.h5"]


@pytest.fixture(scope="module")
def shared_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shared")
    temp = tmp_path_factory.mktemp("workertemp")
    result = run_kdist(["launch", "--workers", "2", "--timeout", "240", "--", sys.executable,
                        os.path.abspath("tests/programs/files_job.py"), str(folder)], timeout=270,
                       env={"TMPDIR": str(temp)})
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    return folder, temp, result.stdout


def test_two_workers_write_every_file_once_and_whole(shared_folder):
    """model.save, save_weights and export called on both workers into one path (as users write
    them), with ModelCheckpoint (save_best_only to a relative .weights.h5), CSVLogger and
    TensorBoard: each file is whole and predicts what the model predicts; each worker's own path
    (tf-keras's pattern) is written and reads back on that worker; nothing else is left."""
    folder, temp, _ = shared_folder
    report = json.loads((folder / "worker-0.json").read_text())
    assert sorted(os.listdir(folder)) == sorted(WRITTEN + ["worker-0.json", "worker-1.json"])
    for name, predicted in report["loaded"].items():
        np.testing.assert_allclose(predicted, report["expected"], rtol=1e-6, err_msg=name)
    assert sorted(report["loaded"]) == ["best.weights.h5", "exported", "model.keras",
                                        "model.weights.h5"]
    for task in ("worker-0", "worker-1"):
        own = json.loads((folder / f"{task}.json").read_text())
        np.testing.assert_allclose(own["own_path"], own["expected"], rtol=1e-6, err_msg=task)
    assert report["csv_lines"][0] == "epoch,loss,val_loss" and len(report["csv_lines"]) == 4
    for run in ("train", "validation"):
        assert len(os.listdir(folder / "tensorboard" / run)) == 1  # one writer
    assert os.listdir(temp) == []  # the other worker's private copies are gone


def test_fit_verbose_0_keeps_kdists_epoch_report_quiet(shared_folder):
    assert "kdist: epoch" not in shared_folder[2], shared_folder[2][-3000:]


@pytest.fixture(autouse=True)
def installed():
    patches.install()  # what kdist.scope() does


@keras.saving.register_keras_serializable("kdist_tests")  # so that only a broken file fails to load
class Failing(keras.layers.Dense):
    """A layer whose variables fail to save after the file is opened (a crash midway)."""

    def save_own_variables(self, store):
        raise RuntimeError("planted failure midway through the save")


def model(layer=keras.layers.Dense, units=4):
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), layer(1)])


def broken_save_over(path):
    good = model()
    good.save(path)
    with pytest.raises(RuntimeError, match="planted failure"):
        model(Failing).save(path)
    return good


def test_a_save_that_fails_midway_leaves_the_previous_file(tmp_path):
    path = str(tmp_path / "model.keras")
    good = broken_save_over(path)
    loaded = keras.saving.load_model(path)
    for mine, theirs in zip(good.weights, loaded.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    assert os.listdir(tmp_path) == ["model.keras"]


def test_upstream_a_save_that_fails_midway_leaves_a_broken_file(tmp_path):
    """Regression evidence: without kdist's fix, Keras writes the user's path directly."""
    path = str(tmp_path / "model.keras")
    fix = patches.patch("model_files_written_whole")
    fix.uninstall()
    try:
        broken_save_over(path)
    finally:
        fix.install()
    with pytest.raises(Exception):
        keras.saving.load_model(path)


@pytest.fixture
def small_disk(tmp_path):
    """A 192 KiB tmpfs mounted at tmp_path/disk (root): skipped where it cannot be mounted,
    except in CI (.ci/run sets KDIST_REQUIRE_ROOT, so it always runs there)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode:
        if os.environ.get("KDIST_REQUIRE_ROOT"):
            pytest.fail(f"cannot mount a tmpfs: {mounted.stderr}")
        pytest.skip(f"cannot mount a tmpfs (root only): {mounted.stderr.strip()}")
    yield disk
    gc.collect()  # h5py closes a file that failed to write when its object goes
    if subprocess.run(["umount", str(disk)]).returncode:  # still open: detach it all the same
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


@pytest.mark.parametrize("method,name", [("save", "model.keras"),
                                         ("save_weights", "model.weights.h5")])
def test_a_full_disk_names_the_path_and_keeps_the_previous_file(small_disk, method, name):
    path = str(small_disk / name)
    small = model()
    getattr(small, method)(path)
    before = open(path, "rb").read()
    with pytest.raises(OSError) as raised:
        getattr(model(units=20000), method)(path)  # 20,000 x 3 float32: more than the disk
    message = str(raised.value)
    assert raised.value.errno == 28 and path in message and "MiB free" in message, message
    assert open(path, "rb").read() == before
    assert os.listdir(small_disk) == [name]


BACKUP_ON_A_SMALL_DISK = """
import sys
import kdist, keras, numpy as np
keras.utils.set_random_seed(0)
with kdist.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1000), keras.layers.Dense(1)])
    model.compile("adam", "mse")
backup = keras.callbacks.BackupAndRestore(sys.argv[1], save_freq=2, delete_checkpoint=False)
x = np.ones((64, 3), "float32")
model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0, callbacks=[backup])
"""


def test_a_backup_on_a_full_disk_ends_with_the_path_and_keeps_the_last_generation(small_disk):
    """The first generation fits, the second does not: the task ends with the OSError naming the
    backup folder and the space left (exit 1, not h5py's crash at exit), and the first generation
    stays whole."""
    from conftest import run_python
    from kdist.fault_tolerance import backup

    folder = str(small_disk / "backup")
    result = run_python(["-c", BACKUP_ON_A_SMALL_DISK, folder], timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("kdist: task")]
    assert len(lines) == 1 and lines[0].startswith(
        f"kdist: task local failed: OSError: [Errno 28] no space left to write {folder} ("), lines
    assert "MiB free on its disk" in lines[0]
    kept = backup.generations(folder)
    assert len(kept) == 1 and sorted(os.listdir(kept[0])) == ["manifest.json", "model.weights.h5"]
    assert sorted(os.listdir(folder)) == [os.path.basename(kept[0])]  # nothing half-written


def test_a_disk_that_fills_during_the_write_names_the_path_and_keeps_the_previous_file(small_disk):
    """What room_for cannot see coming (another writer fills the disk meanwhile)."""
    from kdist import safe_files

    path = str(small_disk / "data.bin")
    with open(path, "wb") as f:
        f.write(b"previous")
    with pytest.raises(OSError) as raised:
        with safe_files.replaced_whole(path) as incoming:
            with open(incoming, "wb") as f:
                f.write(b"x" * (256 << 10))  # more than the 192 KiB disk
    assert raised.value.errno == 28 and path in str(raised.value), raised.value
    assert open(path, "rb").read() == b"previous" and os.listdir(small_disk) == ["data.bin"]
