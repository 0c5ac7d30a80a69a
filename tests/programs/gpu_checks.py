"""The GPU checks (tests/test_gpu.py), in one fresh process: GPU 0 split into 2 logical GPUs
before TensorFlow starts. Prints one JSON line.

- Mirrored over the 2 logical GPUs, N replicas x b against 1 device x N b (the same weights);
- NCCL all-reduce (`all_reduce="nccl"`): the replicas' sums;
- mixed_float16 and mixed_bfloat16, without and with FP16 / PowerSGD compression: finite losses
  that fall;
- ModelParallelDense over the 2 logical GPUs against keras.layers.Dense;
- jit_compile=True under Mirrored on GPUs.
"""

import json

import tensorflow as tf

gpus = tf.config.list_physical_devices("GPU")
tf.config.set_logical_device_configuration(
    gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=4096)] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kdist  # noqa: E402

DEVICES = ["/gpu:0", "/gpu:1"]
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 32)).astype("float32")
y = (x[:, :4] @ rng.normal(size=(4, 1))).astype("float32")
report = {"gpus": [d.name for d in tf.config.list_logical_devices("GPU")]}


def build(seed=1, **scope_options):
    keras.utils.set_random_seed(seed)
    with kdist.scope(**scope_options) as strategy:
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    return model, strategy


one, _ = build(strategy="default", devices=["/gpu:0"])
one.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
two, strategy = build(strategy="mirrored", devices=DEVICES)
two.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
report["equivalence_max_diff"] = max(float(np.abs(a - b).max())
                                     for a, b in zip(one.get_weights(), two.get_weights()))
report["replicas"] = strategy.num_replicas_in_sync

nccl = kdist.strategy("mirrored", devices=DEVICES, all_reduce="nccl")
summed = nccl.reduce("SUM", nccl.run(
    lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32)
    * tf.ones(1 << 20)), axis=None)
report["nccl_sum"] = float(summed[0])

report["precision"] = {}
for policy in ("mixed_float16", "mixed_bfloat16"):
    for compression in (None, "fp16", "powersgd:4"):
        keras.mixed_precision.set_global_policy(policy)
        try:
            model, _ = build(strategy="mirrored", devices=DEVICES, compression=compression)
            losses = model.fit(x, y, batch_size=64, epochs=3, verbose=0).history["loss"]
        finally:
            keras.mixed_precision.set_global_policy("float32")
        report["precision"][f"{policy}/{compression}"] = losses

layer = kdist.layers.ModelParallelDense(48, devices=DEVICES, activation="relu")
layer.build((None, 32))
dense = layer.to_dense()
report["model_parallel_max_diff"] = float(np.abs(layer(x).numpy() - dense(x).numpy()).max())
report["model_parallel_shard_devices"] = [k.value.device for k in layer.kernel_shards]

with kdist.scope(strategy="mirrored", devices=DEVICES):
    jit = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    jit.compile("adam", "mse", jit_compile=True)
report["jit_losses"] = jit.fit(x, y, batch_size=64, epochs=2, verbose=0).history["loss"]
print(json.dumps(report))
