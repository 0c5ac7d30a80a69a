"""Synchronous SGD on N logical CPU devices equals one device with an N-times larger batch.

Run by tests/test_mirrored.py as `python mirrored_equivalence.py N` (a fresh process per N: the
CPU must be split before TensorFlow initialises). Prints one JSON line.
"""

import json
import sys

import kdist

replicas = int(sys.argv[1])
devices = kdist.split_cpu(replicas)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kdist.keras_seam import patches as keras_seam  # noqa: E402
from collective_counts import reduces  # noqa: E402

PER_REPLICA, STEPS = 8, 5
rng = np.random.default_rng(1)
x = rng.normal(size=(PER_REPLICA * replicas * STEPS, 5)).astype("float32")
y = (x @ rng.normal(size=(5, 1)) + 0.1 * rng.normal(size=(len(x), 1))).astype("float32")


def build():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


with kdist.scope(devices=devices) as strategy:
    distributed = build()
    global_batch = kdist.global_batch_size(PER_REPLICA)
reference = build()  # plain Keras, default strategy, one device
initial = distributed.get_weights()
reference.set_weights(initial)

dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
distributed_history = distributed.fit(dataset, epochs=2, verbose=0, shuffle=False)
reference_history = reference.fit(dataset, epochs=2, verbose=0, shuffle=False)
with kdist.scope() as bare:  # no arguments after scope(devices=...): the same strategy, no downgrade
    bare_replicas = bare.num_replicas_in_sync


def fit_steps_per_execution(k):
    """Two epochs of 5 batches, k steps per execution (k=3: the last execution is partial)."""
    with kdist.scope():
        model = build()
        model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=k)
    model.set_weights(initial)
    history = model.fit(dataset, epochs=2, verbose=0, shuffle=False)
    return model, history


def aligned_copy(array):
    """`array` copied into memory aligned on 64 bytes, as NumPy places large arrays (on pages)."""
    raw = np.empty(array.nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    aligned = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    aligned[...] = array
    return aligned


gx, gy = aligned_copy(x), aligned_copy(y)  # TensorFlow wrote into such arrays (upstream below)


def batches():
    """The user's Python generator: the global batches in order, looping, views of gx and gy."""
    while True:
        for start in range(0, len(x), global_batch):
            yield gx[start:start + global_batch], gy[start:start + global_batch]


def fit_generator(scope):
    with scope:
        model = build()
    model.set_weights(initial)
    model.fit(batches(), steps_per_epoch=STEPS, epochs=2, verbose=0)
    return model


def arrays_kept() -> bool:
    return bool((gx == x).all() and (gy == y).all())


class Batches(keras.utils.PyDataset):
    """The same global batches as a PyDataset, views of gx and gy."""

    def __len__(self):
        return STEPS

    def __getitem__(self, index):
        rows = slice(index * global_batch, (index + 1) * global_batch)
        return gx[rows], gy[rows]


with kdist.scope():
    from_pydataset = build()
from_pydataset.fit(Batches(), epochs=1, verbose=0)
pydataset_arrays_kept = arrays_kept()
from_generator = fit_generator(kdist.scope())
generator_arrays_kept = arrays_kept()
reference_generator = fit_generator(tf.distribute.get_strategy().scope())
# Upstream (the fix uninstalled): Mirrored writes into the generator's arrays.
copy_fix = keras_seam.patch("generator_batches_copied")
copy_fix.uninstall()
fit_generator(strategy.scope())  # not kdist.scope(): it would install the fix again
generator_arrays_kept_upstream = arrays_kept()
copy_fix.install()
by_one, _ = fit_steps_per_execution(1)
try:
    by_three, by_three_history = fit_steps_per_execution(3)
    spe3_refused = None
except ValueError as err:  # Keras <= 3.6: refused by kdist (kdist.wiring.dispatch)
    by_three, spe3_refused = by_one, str(err)
spe_fix = keras_seam.patch("steps_per_execution_under_mirrored")
spe_fix_active = spe_fix.active
spe_fix.uninstall()
try:
    fit_steps_per_execution(3)
    upstream_error = None
except Exception as err:  # noqa: BLE001 (the upstream bug, whatever TF raises)
    upstream_error = f"{type(err).__name__}: {str(err)[:300]}"
if spe_fix_active:
    spe_fix.install()


# Fix metric_reset_without_collective: a metric reset reduces nothing, and zeroes every replica's
# copy; upstream (the fix uninstalled) it reduces each metric variable to read it back.
reset_reduces = reduces(strategy, distributed.reset_metrics)
metric_copies_reset = [float(copy.numpy()) for v in distributed.metrics_variables
                       for copy in v.value.values]
reset_fix = keras_seam.patch("metric_reset_without_collective")
reset_fix.uninstall()
reset_reduces_upstream = reduces(strategy, distributed.reset_metrics)
reset_fix.install()


# Upstream without kdist's loss scaling (keras-team/keras#19891, Keras < 3.8): N times the update.
scaling_fix = keras_seam.patch("loss_scaled_per_replica")
scaling_was_active = scaling_fix.active
scaling_fix.uninstall()
with strategy.scope():  # not kdist.scope(): it would install the fix again
    unscaled = build()
unscaled.set_weights(initial)
unscaled.fit(dataset, epochs=2, verbose=0, shuffle=False)
if scaling_was_active:
    scaling_fix.install()

print(json.dumps({
    "keras": keras.__version__,
    "tensorflow": tf.__version__,
    "loss_scaling_fix_active": scaling_was_active,
    "unscaled_max_weight_diff": max(float(np.abs(a - b).max()) for a, b in
                                    zip(unscaled.get_weights(), reference.get_weights())),
    "strategy": type(strategy).__name__,
    "replicas": strategy.num_replicas_in_sync,
    "global_batch": global_batch,
    "variable_type": type(distributed.layers[0].kernel.value).__name__,
    "max_weight_diff": max(float(np.abs(a - b).max()) for a, b in
                           zip(distributed.get_weights(), reference.get_weights())),
    "generator_max_weight_diff": max(float(np.abs(a - b).max()) for a, b in zip(
        from_generator.get_weights(), reference_generator.get_weights())),
    "generator_arrays_kept": generator_arrays_kept,
    "pydataset_arrays_kept": pydataset_arrays_kept,
    "generator_arrays_kept_upstream": generator_arrays_kept_upstream,
    "training_change": max(float(np.abs(a - b).max()) for a, b in
                           zip(distributed.get_weights(), initial)),
    "loss": distributed_history.history["loss"],
    "reference_loss": reference_history.history["loss"],
    "bare_scope_replicas": bare_replicas,
    "spe3_iterations": int(by_three.optimizer.iterations.numpy()),
    "spe3_max_weight_diff": max(float(np.abs(a - b).max()) for a, b in
                                zip(by_three.get_weights(), by_one.get_weights())),
    "spe3_upstream_error": upstream_error,
    "spe3_fix_active": spe_fix_active,
    "spe3_refused": spe3_refused,
    "metric_variables": len(distributed.metrics_variables),
    "reset_reduces": reset_reduces,
    "metric_copies_reset": metric_copies_reset,
    "reset_reduces_upstream": reset_reduces_upstream,
}))
