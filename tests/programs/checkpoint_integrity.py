"""`checkpoint_integrity.py OUT_DIR RUNS`: RUNS fits in one MWMS job, each writing checkpoints.

Run i trains a fresh model with `kdist.callbacks.ModelCheckpoint(OUT_DIR/run-i/model-{epoch}.keras)`
and `kdist.callbacks.BackupAndRestore(OUT_DIR/run-i/backup, save_freq=3, delete_checkpoint=False)`.
Every task records where each save went (`last_written_dir`) in OUT_DIR/writes-<task>.json.
"""

import json
import os
import sys

import kdist

out_dir, runs = sys.argv[1], int(sys.argv[2])
kdist.strategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
task = kdist.cluster().task
writes = []
for run in range(runs):
    folder = os.path.join(out_dir, f"run-{run}")
    with kdist.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    checkpoint = kdist.callbacks.ModelCheckpoint(os.path.join(folder, "model-{epoch}.keras"))
    backup = kdist.callbacks.BackupAndRestore(os.path.join(folder, "backup"), save_freq=3,
                                              delete_checkpoint=False)
    model.fit(x, y, batch_size=kdist.global_batch_size(32), epochs=2, verbose=0,
              callbacks=[checkpoint, backup])
    writes.append(os.path.abspath(checkpoint.last_written_dir))
with open(os.path.join(out_dir, f"writes-{task}.json"), "w") as f:
    json.dump(writes, f)
