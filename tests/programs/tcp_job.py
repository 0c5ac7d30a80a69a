"""`tcp_job.py OUT_DIR ALL_REDUCE`: one task of a MultiWorkerMirrored job (or one process on its
own: the one-device reference) that trains an MLP (no shuffling, global batch 96) with
`kdist.strategy(all_reduce=ALL_REDUCE)`, then writes its weights to
OUT_DIR/weights-<ALL_REDUCE>-<workers>-<task>.npz and prints whether kdist's TCP ring summed its
gradients."""

import os
import sys

import kdist

out_dir, all_reduce = sys.argv[1], sys.argv[2]
strategy = kdist.strategy(all_reduce=all_reduce)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from kdist.exchange import comm  # noqa: E402

GLOBAL_BATCH = 96  # 6 steps per epoch on 1, 2 or 3 workers
rng = np.random.default_rng(0)
x = rng.normal(size=(576, 32)).astype("float32")
y = (x[:, :8] @ rng.normal(size=(8, 1))).astype("float32")
keras.utils.set_random_seed(0)
with kdist.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="tanh"),
                              keras.layers.Dense(64, activation="tanh"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")  # not Adam: it hides a scaled sum
history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0)
spec = kdist.cluster()
name = f"weights-{all_reduce}-{spec.num_workers}-{spec.task or 'local'}.npz"
np.savez(os.path.join(out_dir, name), *model.get_weights(), loss=np.array(history.history["loss"]))
print("ring", comm.tcp_ring(strategy) is not None, flush=True)
