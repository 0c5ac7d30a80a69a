"""BackupAndRestore in one process: a save that dies half-way leaves the previous backup whole, and
double_checkpoint recovers from a corrupted latest backup."""

import os

import keras
import numpy as np
import pytest

import kdist
from kdist.keras_compat.registry import version

pytestmark = pytest.mark.compat  # the compatibility tier: run on every stack (.ci/compat)

X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = X.sum(axis=1, keepdims=True)


def fit(model, backup, epochs):
    return model.fit(X, Y, batch_size=16, epochs=epochs, verbose=0, shuffle=False,
                     callbacks=[backup]).history


def new_model():
    with kdist.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def test_a_save_that_dies_half_way_leaves_the_previous_backup_whole(tmp_path):
    backup_dir = tmp_path / "backup"
    first = new_model()
    fit(first, kdist.callbacks.BackupAndRestore(str(backup_dir), delete_checkpoint=False), 1)
    latest = backup_dir / "latest.weights.h5"
    before = latest.read_bytes()

    second = new_model()
    original_save = second.save_weights

    def dies_half_way(path, overwrite=True):
        with open(path, "wb") as f:
            f.write(b"\\x89HDF half a file")  # what a killed process leaves behind
        raise KeyboardInterrupt("killed mid-save")

    second.save_weights = dies_half_way
    with pytest.raises(KeyboardInterrupt):
        fit(second, kdist.callbacks.BackupAndRestore(str(backup_dir), delete_checkpoint=False), 3)
    second.save_weights = original_save
    assert latest.read_bytes() == before  # the half-written file never replaced it
    third = new_model()
    history = fit(third, kdist.callbacks.BackupAndRestore(str(backup_dir)), 3)
    assert len(history["loss"]) == 2  # resumed after epoch 1 from the intact backup


def test_double_checkpoint_recovers_from_a_corrupted_latest_backup(tmp_path):
    if version(keras.__version__) < (3, 7, 0):  # Keras added it in 3.7
        with pytest.raises(ValueError, match=r"double_checkpoint=True needs Keras >= 3.7"):
            kdist.callbacks.BackupAndRestore(str(tmp_path), double_checkpoint=True)
        return
    backup_dir = tmp_path / "backup"
    first = new_model()
    fit(first, kdist.callbacks.BackupAndRestore(str(backup_dir), double_checkpoint=True,
                                                delete_checkpoint=False), 2)
    assert (backup_dir / "latest.weights.h5.bkp").exists()
    (backup_dir / "latest.weights.h5").write_bytes(b"corrupted")
    second = new_model()
    history = fit(second, kdist.callbacks.BackupAndRestore(str(backup_dir),
                                                           double_checkpoint=True), 3)
    assert len(history["loss"]) >= 1 and np.isfinite(history["loss"]).all()
    assert not os.path.exists(backup_dir)  # deleted once training finished
