"""Correctness of gradient compression under MirroredStrategy on 2 logical CPUs.

Run by tests/test_compression.py in a fresh process (the CPU is split before TF starts); prints
one JSON line of findings that the test asserts on.
"""

import json
import os
import sys
import tempfile

import kdist

devices = kdist.split_cpu(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kdist import compression  # noqa: E402
from kdist.exchange import Exchange  # noqa: E402
from kdist.keras_seam.keras_internals import per_replica_variables  # noqa: E402
from kdist import model_state as state  # noqa: E402
from kdist.wiring.options import TrainingOptions  # noqa: E402


def bind_by_hand(optimizer, compressor):
    """Binds an exchange with `compressor` as it is (kdist.scope() would not bind NoCompression)."""
    state.bind_exchange(optimizer, Exchange(optimizer, TrainingOptions(compression=compressor),
                                                 ring=None))  # Mirrored: no TCP ring

report = {}
rng = np.random.default_rng(0)
x = rng.normal(size=(192, 32)).astype("float32")
y = (x[:, :4] @ rng.normal(size=(4, 1))).astype("float32")


def build(compressor=None, optimizer=None, aggregate_every=1, seed=1, bucket_bytes=None):
    """`optimizer`: a factory, called inside the scope (optimizers capture the strategy)."""
    keras.utils.set_random_seed(seed)
    with kdist.scope(devices=devices, compression=compressor, aggregate_every=aggregate_every,
                     bucket_bytes=bucket_bytes):
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(48, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile((optimizer or (lambda: keras.optimizers.SGD(0.05)))(), "mse")
    return model


def train(model, epochs=2):
    return model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0).history


def same(a, b):
    return all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights()))


def kdist_state(model, name):
    """The compressor state variables called `name`, in optimizer order, by path."""
    return {v.path: np.array(v.numpy()) for v in model.optimizer.variables
            if v.path.endswith(f"_kdist_{name}")}


# kdist's all-reduce path for tensors it does not compress is Keras's own, bit for bit: NoCompression
# bound to the optimizer by hand (kdist.scope() would not bind it at all) sends every gradient
# through kdist's hook uncompressed, and trains exactly like plain Keras.
plain, through_kdist = build(), build()
bind_by_hand(through_kdist.optimizer, compression.NoCompression())
train(plain), train(through_kdist)
report["no_compression_bit_for_bit"] = same(plain, through_kdist) and \
    state.exchange_of(through_kdist) is not None


# The sums themselves, against plain Keras after the same training: TopK with ratio 1 (every entry
# sent, forced through the all-gather path) equals it to float tolerance; FP16 / BF16 within their
# rounding (relative to the largest weight).
class EveryEntry(compression.TopK):
    def should_compress(self, shape):
        return len(shape) >= 2  # even where the indices make the payload larger

    def route(self, shape, replicas):
        return "all_gather", self.payload_bytes(shape)  # even where all-reduce would cost less


def relative_difference(model):
    scale = max(float(np.abs(w).max()) for w in plain.get_weights())
    return max(float(np.abs(a - b).max()) for a, b in
               zip(model.get_weights(), plain.get_weights())) / scale


report["sum_vs_plain"] = {}
for name, compressor in (("topk_ratio_1", EveryEntry(1.0)), ("fp16", compression.FP16()),
                         ("bf16", compression.BF16())):
    compressed = build(compressor)
    train(compressed)
    report["sum_vs_plain"][name] = relative_difference(compressed)

# TopK's sparsity warm-up: the ratio sent changes at the scheduled steps (bytes in the step logs),
# the stages' sums still the sums; EveryEntry's warm-up at ratio 1 then equals plain Keras.
bytes_per_step = []
staged = build(compression.TopK(0.1, warmup=(0.25, 0.125), warmup_steps=3))
staged.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[
    keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: bytes_per_step.append(
        float(logs["comm_bytes_per_step"])))])
report["topk_warmup_bytes"] = bytes_per_step
exact_warmup = build(EveryEntry(0.01, warmup=(1.0,), warmup_steps=12))
train(exact_warmup)  # 2 epochs x 6 steps: all of them in the ratio-1 stage
report["topk_warmup_ratio_1_vs_plain"] = relative_difference(exact_warmup)

# Values in float16: half the value bytes, and the rounding kept in the residual.
half = compression.TopK(0.5, values="float16")
gradient = tf.constant(rng.normal(size=(4, 6)).astype("float32") * 1e-3 + 1.0)
residual = keras.Variable(np.zeros((4, 6), "float32"))
(values16, indices16), _ = half.compress(gradient, {"residual": residual}, 2)
resent = tf.scatter_nd(tf.cast(indices16, tf.int64)[:, None], tf.cast(values16, tf.float32), [24])
report["topk_float16"] = {
    "dtype": values16.dtype.name, "payload_bytes": half.payload_bytes((4, 6)),
    "feedback_exact": float(np.abs(tf.reshape(resent, (4, 6)) + residual.numpy()
                                   - gradient.numpy()).max()),
    "rounding_kept": float(np.abs(residual.numpy()).max())}
halves = build(compression.TopK(0.1, values="float16"))
report["topk_float16_trains"] = train(halves)["loss"][-1] < train(build())["loss"][0]

# TopK's route by size: at 60% of the entries, 2 payloads (value + index) weigh more than twice
# the dense gradient, so the entries are scattered and all-reduced. The same entries are summed:
# the weights equal those of the all-gather route exactly (2 replicas: a + b either way), and no
# all-gather is traced.
class ByRoute(EveryEntry):
    route = compression.TopK.route


gathers = []
all_gather = compression.Comm.all_gather
compression.Comm.all_gather = lambda comm, tensors: gathers.append(len(tensors)) or \
    all_gather(comm, tensors)
routes = {}
for name, compressor in (("gather", EveryEntry(0.6)), ("dense", ByRoute(0.6))):
    gathers.clear()
    routes[name] = build(compressor)
    train(routes[name])
    report.setdefault("topk_route", {})[name] = {
        "route": compressor.route((32, 48), 2)[0], "gathered_tensors": sum(gathers),
        "bytes": compression.stats(routes[name])["comm_bytes_per_step"]}
compression.Comm.all_gather = all_gather
report["topk_route"]["max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(
    routes["gather"].get_weights(), routes["dense"].get_weights()))
report["topk_route"]["trained"] = not same(routes["dense"], build())

# DGC's local clipping: one SGD(1) step on 2 replicas sums each replica's gradient clipped to
# clip_norm / sqrt(2); the replicas' gradients are taken by hand on their halves of the batch
# (each half's mean loss / 2: Keras's global mean).
def clipped_step(clip_norm):
    keras.utils.set_random_seed(5)
    with kdist.scope(devices=devices, compression=EveryEntry(1.0, clip_norm=clip_norm)):
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(4, use_bias=False)])
        model.compile(keras.optimizers.SGD(1.0), "mse")
    before = model.get_weights()[0]
    model.fit(x[:64], np.repeat(y[:64], 4, axis=1), batch_size=64, epochs=1, shuffle=False,
              verbose=0)
    return before, model.get_weights()[0] - before


def replica_gradient(kernel, half):
    variable = tf.Variable(kernel)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((x[half] @ variable - np.repeat(y[half], 4, axis=1)) ** 2) / 2
    return tape.gradient(loss, variable).numpy()


kernel, unclipped = clipped_step(None)
halves = [replica_gradient(kernel, slice(0, 32)), replica_gradient(kernel, slice(32, 64))]
threshold = 0.05 / np.sqrt(2)
expected = -sum(g * min(1.0, threshold / np.linalg.norm(g)) for g in halves)
_, clipped = clipped_step(0.05)
report["topk_clip"] = {
    "unclipped_vs_hand": float(np.abs(unclipped + sum(halves)).max()),
    "clipped_vs_hand": float(np.abs(clipped - expected).max()),
    "replica_norms": [float(np.linalg.norm(g)) for g in halves],
    "step_norm": float(np.linalg.norm(clipped))}

# PowerSGD is exact when the summed gradient has rank <= r (here rank 2, r = 2).
strategy = kdist.strategy(devices=devices)
with strategy.scope(), per_replica_variables("mean"):  # as kdist's hook creates its state
    states = [{"q": keras.Variable(keras.initializers.RandomNormal(seed=3)((40, 2)),
                                   aggregation="mean"),
               "residual": keras.Variable(np.zeros((30, 40), "float32"), aggregation="mean")}]
u, v = rng.normal(size=(30, 2)).astype("float32"), rng.normal(size=(2, 40)).astype("float32")


@tf.function
def exactness():
    def replica():
        context = tf.distribute.get_replica_context()
        scale = tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
        grad = scale * (u @ v)  # replicas differ, the sum (3 u v) has rank 2
        comm = compression.Comm(context, tf.constant(0, tf.int64), ring=None)
        return compression.PowerSGD(rank=2).aggregate([grad], states, comm)[0]

    return strategy.run(replica)


approx = strategy.experimental_local_results(exactness())[0].numpy()
report["powersgd_rank_r_error"] = float(np.abs(approx - 3 * u @ v).max() / np.abs(3 * u @ v).max())

# Which tensors are compressed.
report["should_compress"] = {
    "powersgd_bias": compression.PowerSGD(rank=4).should_compress((1024,)),
    "powersgd_thin": compression.PowerSGD(rank=4).should_compress((1024, 4)),
    "powersgd_low_rate": compression.PowerSGD(rank=4, min_compression_rate=200).should_compress(
        (64, 64)),
    "powersgd_kernel": compression.PowerSGD(rank=4).should_compress((64, 64)),
    "topk_bias": compression.TopK(0.01).should_compress((1024,)),
    "fp16_bias": compression.FP16().should_compress((1024,)),
}

# start_step: uncompressed (identical to plain) until the step, compressed after.
warm = build(compression.PowerSGD(rank=1, start_step=6))
twin = build()
first = warm.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history  # 6 steps
twin.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
report["warmup_equal_to_plain"] = same(warm, twin)
second = warm.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history
twin.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
report["compressed_after_warmup_differs"] = not same(warm, twin)
report["warmup_ratio_logs"] = [first["comm_ratio"][0], second["comm_ratio"][0]]

# Error-feedback residuals and PowerSGD's Q are saved and restored with the weights.
source = build(compression.PowerSGD(rank=2))
train(source, epochs=1)
path = os.path.join(tempfile.mkdtemp(), "compressed.weights.h5")
source.save_weights(path)
target = build(compression.PowerSGD(rank=2), seed=2)
target.optimizer.build(target.trainable_variables)
target.load_weights(path)
report["state_shapes"] = {n: [list(a.shape) for a in kdist_state(source, n).values()]
                          for n in ("residual", "q")}
report["residual_nonzero"] = any(np.abs(a).max() > 0 for a in kdist_state(source, "residual").values())


def state_equal(saved_model, loaded_model) -> bool:
    """Residuals and Q of both models, in optimizer order (their paths differ): equal and present."""
    pairs = [(list(kdist_state(saved_model, n).values()), list(kdist_state(loaded_model, n).values()))
             for n in ("residual", "q")]
    return all(saved and len(saved) == len(loaded) and all(np.array_equal(a, b)
                                                           for a, b in zip(saved, loaded))
               for saved, loaded in pairs)


report["state_restored"] = state_equal(source, target)
# The same through the stock callbacks a user writes: ModelCheckpoint (a whole .keras model,
# loaded back under the same scope) and BackupAndRestore (restored at the start of fit).
folder = tempfile.mkdtemp()
checkpointed = build(compression.PowerSGD(rank=2))
checkpointed.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[
    keras.callbacks.ModelCheckpoint(os.path.join(folder, "model.keras")),
    keras.callbacks.BackupAndRestore(os.path.join(folder, "backup"), delete_checkpoint=False)])
with kdist.scope(devices=devices, compression=compression.PowerSGD(rank=2)):
    loaded = keras.models.load_model(os.path.join(folder, "model.keras"))
report["state_restored_model_checkpoint"] = state_equal(checkpointed, loaded)
resumed = build(compression.PowerSGD(rank=2), seed=2)
resumed.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,  # epoch 1 is done: no step
            callbacks=[keras.callbacks.BackupAndRestore(os.path.join(folder, "backup"))])
report["state_restored_backup_and_restore"] = state_equal(checkpointed, resumed)

# Variants: PowerSGD without warm start or error feedback, TopK without error feedback, and a
# user's own Compressor (bfloat16 by hand, the docstring's example) each train end to end.
class HandMadeBF16(compression.Compressor):
    def compress(self, grad, state, replicas):
        return (tf.cast(grad, tf.bfloat16),), None

    def decompress(self, payload, meta, grad, state, replicas):
        return tf.cast(payload[0], grad.dtype)

    def payload_bytes(self, shape):
        return 2 * int(np.prod(shape))


report["variants"] = {}
for name, compressor in {"powersgd_cold": compression.PowerSGD(rank=2, warm_start=False),
                         "powersgd_no_feedback": compression.PowerSGD(rank=2, error_feedback=False),
                         "topk_no_feedback": compression.TopK(0.1, error_feedback=False),
                         "custom": HandMadeBF16()}.items():
    variant = build(compressor)
    losses = train(variant, epochs=3)["loss"]
    report["variants"][name] = {
        "loss": losses, "ratio": compression.stats(variant)["comm_ratio"],
        "state": sorted({v.path.rsplit("_kdist_", 1)[1] for v in variant.optimizer.variables
                         if "_kdist_" in v.path})}

# TopK keeps the unsent part as a residual; any Keras optimizer works.
optimizers = {"sgd": lambda: keras.optimizers.SGD(0.05),
              "adam": lambda: keras.optimizers.Adam(0.01),
              "rmsprop": lambda: keras.optimizers.RMSprop(0.005),
              "adamw": lambda: keras.optimizers.AdamW(0.01)}
report["optimizers"] = {}
for name, optimizer in optimizers.items():
    for compressor in (compression.PowerSGD(rank=2), compression.TopK(0.1), compression.FP16()):
        losses = train(build(compressor, optimizer=optimizer), epochs=3)["loss"]
        report["optimizers"][f"{name}/{type(compressor).__name__}"] = losses[-1] < losses[0]

# Sparse gradients (Embedding -> IndexedSlices) are densified, never a crash.
ids = rng.integers(0, 50, size=(128, 4)).astype("int32")
labels = (ids.sum(1) % 2).astype("float32")
report["sparse"] = {}
for compressor in (compression.PowerSGD(rank=2), compression.TopK(0.05), compression.BF16()):
    with kdist.scope(devices=devices, compression=compressor):
        model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(50, 16),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile("adam", "mse")
    loss = model.fit(ids, labels, batch_size=32, epochs=1, verbose=0).history["loss"][0]
    report["sparse"][type(compressor).__name__] = bool(np.isfinite(loss))

# FP16 never overflows silently.
huge = build(compression.FP16(), optimizer=lambda: keras.optimizers.SGD(1e-12))
try:
    huge.fit(x, y * 1e12, batch_size=32, epochs=1, verbose=0)
    report["fp16_overflow"] = "no error"
except tf.errors.InvalidArgumentError as err:
    report["fp16_overflow"] = "overflows float16" in str(err) and "use BF16" in str(err)

# aggregate_every=2 on batch b equals one step on batch 2b every second step: SGD on the mean
# of two gradients (Keras's own gradient_accumulation_steps fails under tf.distribute).
every = build(aggregate_every=2)
twice_the_batch = build()
every.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
twice_the_batch.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
report["aggregate_every_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(
    every.get_weights(), twice_the_batch.get_weights()))
report["aggregate_every_iterations"] = int(every.optimizer.iterations.numpy())
try:
    build(optimizer=lambda: keras.optimizers.SGD(0.05, gradient_accumulation_steps=2))
    with kdist.scope(devices=devices, aggregate_every=2):
        clash = keras.Sequential([keras.Input((32,)), keras.layers.Dense(1)])
        clash.compile(keras.optimizers.SGD(0.05, gradient_accumulation_steps=2), "mse")
    report["accumulation_clash"] = "no error"
except ValueError as err:
    report["accumulation_clash"] = str(err)

# Buckets (bucket_bytes): the same sums, one collective per bucket, last layer first; alone, with
# compression and with aggregate_every. 1 byte: every tensor is a bucket of its own.
report["buckets"] = {}


def positions(model):
    """The traced buckets, as positions in model.trainable_variables (kernel 0, bias 0, ...)."""
    where = {v.value.name: i for i, v in enumerate(model.trainable_variables)}
    return [[where[name] for name in bucket] for bucket in state.exchange_of(model).traced_buckets]


for name, options, fit_batch in (("plain", {}, 32), ("fp16", {"compressor": compression.FP16()}, 32),
                                 ("aggregate_every", {"aggregate_every": 2}, 16)):
    one_batch, bucketed = build(**options), build(**options, bucket_bytes=1)
    for model in (one_batch, bucketed):
        model.fit(x, y, batch_size=fit_batch, epochs=2, shuffle=False, verbose=0)
    report["buckets"][name] = {
        "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(one_batch.get_weights(),
                                                                   bucketed.get_weights())),
        "trained": max(float(np.abs(a - b).max()) for a, b in zip(bucketed.get_weights(),
                                                                  build().get_weights())),
        "traced": positions(bucketed)}
two_buckets = build(bucket_bytes=48 * 4 + 4)  # first bucket: dense_1's bias and kernel
train(two_buckets)
report["buckets_grouped"] = positions(two_buckets)

# Nominal bytes for the 784-1024-1024-10 MLP.
with kdist.scope(devices=devices):
    mlp = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024), keras.layers.Dense(1024),
                            keras.layers.Dense(10)])
report["nominal_ratio"] = {}
for compressor in (compression.FP16(), compression.PowerSGD(rank=4), compression.TopK(0.01)):
    mlp.optimizer = keras.optimizers.SGD()
    bind_by_hand(mlp.optimizer, compressor)
    report["nominal_ratio"][type(compressor).__name__] = compression.stats(mlp)["comm_ratio"]

print(json.dumps(report))
sys.stdout.flush()
