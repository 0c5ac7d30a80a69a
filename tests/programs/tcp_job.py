"""`tcp_job.py OUT_DIR ALL_REDUCE`: one task of a 2-worker MultiWorkerMirrored job that trains an
MLP (no shuffling) with `kdist.scope(all_reduce=ALL_REDUCE)`, then writes its weights to
OUT_DIR/weights-<ALL_REDUCE>-<task>.npz and what its gradient sums went through."""

import os
import sys

import kdist

out_dir, all_reduce = sys.argv[1], sys.argv[2]
strategy = kdist.strategy(all_reduce=all_reduce)

import keras  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 32)).astype("float32")
y = (x[:, :8] @ rng.normal(size=(8, 1))).astype("float32")
keras.utils.set_random_seed(0)
with kdist.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="tanh"),
                              keras.layers.Dense(64, activation="tanh"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(1e-2), "mse")
history = model.fit(x, y, batch_size=kdist.global_batch_size(32), epochs=3, shuffle=False, verbose=0)
task = kdist.cluster().task
np.savez(os.path.join(out_dir, f"weights-{all_reduce}-{task}.npz"), *model.get_weights(),
         loss=np.array(history.history["loss"]))
from kdist.exchange import comm  # noqa: E402

print("ring", comm.tcp_ring(strategy) is not None, flush=True)
