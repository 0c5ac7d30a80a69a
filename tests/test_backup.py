"""Backups that cannot lie (`kdist.fault_tolerance.backup`, `kdist.callbacks.BackupAndRestore`), in
one process: every damage a disk, a copy or a user can do to a backup ends in a verified fallback to
the previous generation (a warning naming both paths, the previous state restored exactly) or in one
error naming the path, what is wrong and the fix; never in a silent resume from other state.

The damages are applied to whatever files the backup wrote (the newest weights file and the JSON
beside it), so the same test runs against any backup format."""

import glob
import logging
import os

import h5py
import keras
import numpy as np
import pytest

import kdist
from kdist.fault_tolerance import backup


X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = X.sum(axis=1, keepdims=True)


def new_model(units=8, seed=0):
    keras.utils.set_random_seed(seed)
    with kdist.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def fit(model, backup_dir, epochs, save_freq=2, delete=False):
    callback = keras.callbacks.BackupAndRestore(str(backup_dir), save_freq=save_freq,
                                                delete_checkpoint=delete)
    history = model.fit(X, Y, batch_size=16, epochs=epochs, verbose=0, shuffle=False,
                        callbacks=[callback])
    return callback, history.history


class Recorder(keras.callbacks.Callback):
    """The model's and optimizer's values when training begins (after the backup's restore)."""

    def on_train_begin(self, logs=None):
        self.values = [np.asarray(v) for v in self.model.weights + self.model.optimizer.variables]


def restore_and_record(model, backup_dir):
    """A fit that restores from `backup_dir` (saving no new generation); returns the backup
    callback and the values it restored."""
    callback = keras.callbacks.BackupAndRestore(str(backup_dir), save_freq=1000,
                                                delete_checkpoint=False)
    recorder = Recorder()
    model.fit(X, Y, batch_size=16, epochs=1, verbose=0, shuffle=False,
              callbacks=[callback, recorder])
    return callback, recorder.values


def newest_files(backup_dir):
    """(weights file, metadata file) the newest save wrote, whatever the format."""
    weights = sorted((p for p in glob.glob(f"{backup_dir}/**/*.weights.h5", recursive=True)),
                     key=os.path.getmtime)[-1]
    folder = os.path.dirname(weights)
    metadata = [p for p in glob.glob(f"{folder}/*.json")]
    return weights, metadata[0]


def overwrite(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def dataset_offset(path, predicate):
    """Byte offset of the first dataset of the weights file for which predicate(name, shape)."""
    with h5py.File(path) as f:
        found = []
        f.visititems(lambda name, obj: found.append((name, obj)) if isinstance(
            obj, h5py.Dataset) and predicate(name, obj.shape) else None)
        return found[0][1].id.get_offset()


GARBAGE = bytes(range(256)) * 16


def truncate_weights(weights, metadata):
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)


DAMAGES = {
    "weights truncated to half": truncate_weights,
    "garbage over the first 4 KiB": lambda w, m: overwrite(w, 0, GARBAGE[:4096]),
    "garbage metadata": lambda w, m: overwrite(m, 0, b"\x00garbage{" * 20),
    "512 garbage bytes at 60%": lambda w, m: overwrite(w, int(os.path.getsize(w) * 0.6),
                                                       GARBAGE[:512]),
    "garbage in the first kernel's values": lambda w, m: overwrite(
        w, dataset_offset(w, lambda name, shape: name.startswith("layers") and len(shape) == 2),
        GARBAGE[:16]),
    "garbage in an Adam slot": lambda w, m: overwrite(
        w, dataset_offset(w, lambda name, shape: name.startswith("optimizer") and len(shape) == 2),
        GARBAGE[:16]),
    "weights deleted, metadata kept": lambda w, m: os.remove(w),
    "metadata deleted, weights kept": lambda w, m: os.remove(m),
}


def saved_state(weights_path):
    """Every dataset of a weights file, by name."""
    with h5py.File(weights_path) as f:
        state = {}
        f.visititems(lambda name, obj: state.update({name: obj[()]})
                     if isinstance(obj, h5py.Dataset) else None)
        return state


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_backup_falls_back_to_the_previous_generation_exactly(tmp_path, damage):
    backup_dir = tmp_path / "backup"
    fit(new_model(), backup_dir, epochs=1)  # 4 steps, saved at steps 2 and 4
    generations = backup.generations(str(backup_dir))
    assert len(generations) == 2
    previous = backup.verify(generations[1])
    previous_state = saved_state(previous.weights)
    DAMAGES[damage](*newest_files(backup_dir))
    model = new_model(seed=1)  # other initial weights: a fresh start would show
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("kdist").addHandler(handler)  # kdist's logger does not propagate
    try:
        callback, model_values = restore_and_record(model, backup_dir)
    finally:
        logging.getLogger("kdist").removeHandler(handler)
    warnings = [line for line in lines if "cannot be restored" in line]
    assert len(warnings) == 1 and generations[0] in warnings[0] and generations[1] in warnings[0]
    assert callback.restored.path == generations[1]
    assert callback.restored.position == {"epoch": 0, "step": 2, "examples": 32}
    saved_values = [previous_state[k] for k in sorted(previous_state, key=_h5_order)]
    assert len(model_values) == len(saved_values) == 4 + 10  # optimizer slots included
    for got, saved in zip(model_values, saved_values):
        np.testing.assert_array_equal(got, saved)


def _h5_order(name):
    """layers/dense/vars/0 ... then optimizer/vars/0 ...: the order Keras saves them in."""
    parts = name.split("/")
    return (parts[0] != "layers", [int(p) if p.isdigit() else p for p in parts])


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_only_backup_stops_with_the_path_and_the_fix(tmp_path, damage):
    backup_dir = tmp_path / "backup"
    fit(new_model(), backup_dir, epochs=1, save_freq="epoch")  # one save
    DAMAGES[damage](*newest_files(backup_dir))
    model = new_model(seed=1)
    before = [np.asarray(w) for w in model.get_weights()]
    with pytest.raises(backup.BackupError) as error:
        fit(model, backup_dir, epochs=2, save_freq="epoch")
    message = str(error.value)
    assert str(backup_dir) in message and "Fix:" in message and "\n" not in message
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))  # untouched


def test_a_backup_of_another_architecture_is_refused_even_with_a_good_previous_one(tmp_path):
    backup_dir = tmp_path / "backup"
    fit(new_model(units=8), backup_dir, epochs=1)
    with pytest.raises(backup.BackupError, match=r"written by another model: variable 0 "
                                                 r"\(.*kernel here\) is \(4, 8\) float32 in the "
                                                 r"backup and \(4, 16\) float32 in this model.*Fix: "
                                                 r"build the same model"):
        fit(new_model(units=16), backup_dir, epochs=2)


def test_an_intact_backup_resumes_its_exact_state_and_keeps_two_generations(tmp_path):
    backup_dir = tmp_path / "backup"
    fit(new_model(), backup_dir, epochs=1)
    newest = backup.generations(str(backup_dir))[0]
    state = saved_state(os.path.join(newest, backup.WEIGHTS))
    callback, values = restore_and_record(new_model(seed=1), backup_dir)
    assert callback.restored.path == newest and callback.restored.position["epoch"] == 1
    for got, saved in zip(values, [state[k] for k in sorted(state, key=_h5_order)]):
        np.testing.assert_array_equal(got, saved)
    _, history = fit(new_model(seed=1), backup_dir, epochs=3)
    assert len(history["loss"]) == 2  # epochs 1 and 2: epoch 0 came from the backup
    assert len(backup.generations(str(backup_dir))) == backup.KEEP


def test_a_save_that_dies_half_way_leaves_the_previous_backup_whole(tmp_path):
    backup_dir = tmp_path / "backup"
    fit(new_model(), backup_dir, epochs=1, save_freq="epoch")
    before = backup.generations(str(backup_dir))

    def dies_half_way(path):
        with open(path, "wb") as f:
            f.write(b"\\x89HDF half a file")  # what a killed process leaves behind
        raise KeyboardInterrupt("killed mid-save")

    model = new_model()
    with pytest.raises(KeyboardInterrupt):
        backup.write(str(backup_dir), model, {"epoch": 5, "step": 0}, save=dies_half_way)
    assert backup.generations(str(backup_dir)) == before  # no half generation, no temp folder
    assert [n for n in os.listdir(backup_dir) if n.startswith(".")] == []
    _, history = fit(new_model(), backup_dir, epochs=3, save_freq="epoch", delete=True)
    assert len(history["loss"]) == 2  # resumed after epoch 1 from the intact backup
    assert not os.path.exists(backup_dir)  # deleted once training finished


def test_a_backup_without_a_manifest_is_refused_not_restored_unchecked(tmp_path):
    """Keras's own BackupAndRestore format (latest.weights.h5 + training_metadata.json) cannot be
    verified: kdist names it and the fix instead of restoring it."""
    backup_dir = tmp_path / "backup"
    backup_dir.mkdir()
    model = new_model()
    model.save_weights(str(backup_dir / "latest.weights.h5"))
    (backup_dir / "training_metadata.json").write_text('{"epoch": 1, "batch": 0}')
    with pytest.raises(backup.BackupError, match=r"latest.weights.h5, training_metadata.json "
                                                 r"without a kdist manifest.*Fix: move it away"):
        fit(new_model(), backup_dir, epochs=2)


def test_a_generation_planted_as_a_symlink_is_neither_restored_nor_counted(tmp_path):
    """In a shared backup directory another user could plant `generation-999999` pointing at a
    backup of their own: it is ignored, and the next save is numbered after the real ones."""
    backup_dir = tmp_path / "backup"
    fit(new_model(), backup_dir, epochs=1, save_freq="epoch")
    real = backup.generations(str(backup_dir))
    planted = tmp_path / "theirs"
    fit(new_model(units=8, seed=7), planted, epochs=2, save_freq="epoch")
    os.symlink(backup.generations(str(planted))[0], backup_dir / "generation-999999")
    assert backup.generations(str(backup_dir)) == real
    callback, _ = restore_and_record(new_model(seed=1), backup_dir)
    assert callback.restored.path == real[0]
    written = backup.write(str(backup_dir), new_model(), {"epoch": 1, "step": 0})
    assert os.path.basename(written) == "generation-%06d" % (int(real[0][-6:]) + 1)
    assert os.path.isdir(backup.generations(str(planted))[0])  # theirs untouched


BUILT_BEFORE_THE_SCOPE = """
import sys
import kdist, keras, numpy as np
backup = keras.callbacks.BackupAndRestore(sys.argv[1], save_freq=2, delete_checkpoint=False)
stock = type(backup) is keras.callbacks.BackupAndRestore
with kdist.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
x = np.ones((16, 3), "float32")
model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[backup])
print(stock, isinstance(backup, kdist.callbacks.BackupAndRestore), backup.save_freq)
"""


def test_a_backup_built_before_the_first_scope_is_kdists_at_fit(tmp_path):
    """`keras.callbacks.BackupAndRestore(...)` built after `import kdist` but before the first
    `kdist.scope()` (Keras's own class then) trains as kdist's: verified generations."""
    from conftest import run_python

    result = run_python(["-c", BUILT_BEFORE_THE_SCOPE, str(tmp_path / "backup")], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True", "2"], result.stdout
    written = backup.generations(str(tmp_path / "backup"))
    assert written and os.path.isfile(os.path.join(written[0], "manifest.json"))
