"""Every file a user's program writes, written by 2 workers into one shared folder, for
tests/test_files.py:

    kdist launch --workers 2 -- python files_job.py FOLDER

Each worker runs the same program in FOLDER (its working directory, as on a shared disk):
ModelCheckpoint with save_best_only to a relative `.weights.h5`, a `.keras` checkpoint per
epoch, CSVLogger and TensorBoard, then `model.save`, `model.save_weights` and `model.export`, as
users write them (every worker calls them). Each worker then writes FOLDER/<task>.json with what
it found in the folder after a barrier.
"""

import json
import os
import sys

import kdist
import keras
import numpy as np

folder = sys.argv[1]
os.chdir(folder)
spec = kdist.cluster()
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
y = x.sum(1, keepdims=True)

with kdist.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
model.fit(x, y, batch_size=kdist.global_batch_size(8), epochs=3, verbose=0, validation_split=0.25,
          callbacks=[keras.callbacks.ModelCheckpoint("best.weights.h5", save_weights_only=True,
                                                     save_best_only=True),
                     keras.callbacks.ModelCheckpoint("epoch-{epoch}.keras"),
                     keras.callbacks.CSVLogger("log.csv"),
                     keras.callbacks.TensorBoard("tensorboard")])
model.save("model.keras")
model.save_weights("model.weights.h5")
model.export("exported")  # Keras < 3.6 has no verbose
own_path = f"{spec.task_type}-{spec.task_index}.weights.h5"  # tf-keras's guide's pattern
model.save_weights(own_path)
kdist.barrier()  # every worker's files are whole once every worker is here

found = sorted(os.listdir("."))
expected = model.predict(x[:4], verbose=0).ravel().tolist()
loaded = {}
twin = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
twin.load_weights(own_path)
own_predicted = twin.predict(x[:4], verbose=0).ravel().tolist()
if spec.is_chief:  # the chief reads its own files back (the others may still be writing reports)
    import tensorflow as tf

    loaded["model.keras"] = keras.saving.load_model("model.keras").predict(x[:4], verbose=0)
    for name in ("model.weights.h5", "best.weights.h5"):
        twin = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
        twin.load_weights(name)
        loaded[name] = twin.predict(x[:4], verbose=0)
    exported = tf.saved_model.load("exported")  # kept: its functions need its variables
    loaded["exported"] = exported.serve(x[:4]).numpy()
    loaded = {name: value.ravel().tolist() for name, value in loaded.items()}
with open(f"{spec.task_type}-{spec.task_index}.json", "w") as f:
    json.dump({"found": found, "expected": expected, "loaded": loaded, "own_path": own_predicted,
               "csv_lines": open("log.csv").read().splitlines() if spec.is_chief else None}, f)
