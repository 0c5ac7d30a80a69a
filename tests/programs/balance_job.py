"""`kdist.scope(balance=...)`, run by tests/test_balance.py in two ways:

- `python balance_job.py mirrored OUT_DIR`: Mirrored over 2 logical CPUs, fixed shares [3, 1] and
  "measure";
- `kdist launch --workers 2 -- python balance_job.py workers OUT_DIR`: MultiWorkerMirrored, worker 1
  in the CPU cgroup named by KDIST_TEST_CGROUP (a CPU quota: a slow machine), "measure".

Each run trains the model the way a Keras user does (`fit` on NumPy arrays), and a plain Keras model
(one device, the global batch) from the same weights on the same data; a probe layer counts the
examples each replica saw. Each task writes OUT_DIR/<mode>-<task>.json.
"""

import json
import os
import sys

mode, out_dir = sys.argv[1], sys.argv[2]
task = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
if mode == "workers" and os.environ.get("KDIST_TEST_CGROUP") and task == 1:
    with open(os.path.join(os.environ["KDIST_TEST_CGROUP"], "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))  # every thread of this process, from here on

import kdist  # noqa: E402

if mode == "mirrored":
    devices = kdist.split_cpu(2)
strategy = kdist.strategy()  # MWMS: before any other TF op

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kdist.keras_seam import keras_internals  # noqa: E402

REPLICAS = strategy.num_replicas_in_sync
GLOBAL_BATCH, STEPS, FEATURES = 64, 6, 256
# On 2 workers, a pass that outlasts the capped worker's CPU quota (2 ms in every 10 ms), so that
# the quota slows every timed pass; a 256-wide pass (about 0.3 ms) often fits in one period's
# quota unthrottled and measured nearly as fast as the free worker's (shares 0.44-0.49, not < 0.4)
HIDDEN = 1024 if mode == "workers" else 256
rng = np.random.default_rng(0)  # the same data on every worker
x = rng.normal(size=(GLOBAL_BATCH * STEPS - 24, FEATURES)).astype("float32")  # a partial last batch
y = rng.integers(0, 10, size=len(x)).astype("int32")


class ExamplesPerReplica(keras.layers.Layer):
    """Counts the training examples each replica's batches held (an identity on the data)."""

    def build(self, input_shape):
        with keras_internals.per_replica_variables("sum"):
            self.seen = self.add_weight(shape=(REPLICAS,), initializer="zeros", trainable=False,
                                        name="seen")

    def call(self, inputs, training=False):
        if training:
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            count = tf.cast(tf.shape(inputs)[0], "float32")
            self.seen.assign_add(tf.one_hot(replica, REPLICAS) * count)
        return inputs


def build():
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((FEATURES,)), ExamplesPerReplica(),
                              keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def train(balance):
    with kdist.scope(balance=balance):
        model = build()
    initial = [w.numpy() for w in model.trainable_weights]
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    trained = [w.numpy() for w in model.trainable_weights]
    report = {"shares": list(kdist.balance.shares_of(model)),
              "seen": model.layers[0].seen.numpy().tolist(),
              "expected_seen": expected_counts(kdist.balance.shares_of(model)),
              "training_change": max(float(np.abs(a - b).max()) for a, b in zip(trained, initial)),
              "loss": history.history["loss"], "accuracy": history.history["accuracy"]}
    if task == 0:  # plain Keras on one device from the same weights: once is enough
        plain = build()
        for variable, value in zip(plain.trainable_weights, initial):
            variable.assign(value)
        reference = plain.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        report.update(
            max_weight_diff=max(float(np.abs(a - w.numpy()).max())
                                for a, w in zip(trained, plain.trainable_weights)),
            reference_loss=reference.history["loss"],
            reference_accuracy=reference.history["accuracy"])
    return report


def expected_counts(shares):
    """Examples per replica over the 2 epochs if every global batch is split by `shares`."""
    sizes = [min(GLOBAL_BATCH, len(x) - start) for start in range(0, len(x), GLOBAL_BATCH)]
    return [2 * sum(int(kdist.balance.split_sizes(tf.constant(n, tf.int64), shares)[r])
                    for n in sizes) for r in range(REPLICAS)]


def refusal(**scope_args):
    try:
        with kdist.scope(**scope_args):
            build()
    except ValueError as error:
        return str(error)
    return None


report = {"strategy": type(strategy).__name__, "replicas": REPLICAS}
if mode == "mirrored":
    report["fixed"] = train([3, 1])
    report["measured"] = train("measure")
    report["refused_aggregate_every"] = refusal(balance="measure", aggregate_every=2)
    report["refused_length"] = refusal(balance=[1, 1, 1])
else:
    report["measured"] = train("measure")
with open(os.path.join(out_dir, f"{mode}-{task}.json"), "w") as f:
    json.dump(report, f)
