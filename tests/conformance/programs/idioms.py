"""The idioms Keras users write, each trained once on one device and once under a kdist strategy,
for tests/conformance/test_idioms.py. The only kdist lines are the ones a user adds.

    python idioms.py one_device OUT       plain Keras, no strategy, the global batch
    python idioms.py mirrored OUT         kdist.split_cpu(2) + kdist.scope(): 2 replicas
    kdist launch --workers 2 -- python idioms.py multi_worker OUT
    python idioms.py upstream OUT         mirrored, with kdist's fixes of these idioms removed:
                                          the upstream bugs, shown (their regression evidence)

Every idiom trains on the same data in the same order with the same global batch, from the same
initial weights. Each process writes OUT/<mode>[-<task>]/<idiom>.npz (every model and optimizer
variable, by path) and OUT/<mode>[-<task>].json: per idiom its fit logs, what evaluate returned,
the largest difference between the replicas' copies of any variable (2 replicas in this process),
or the error it raised. `python idioms.py compare OUT` prints each idiom's difference from one
device (the table of the closing notes).
"""

import contextlib
import json
import logging
import os
import sys
import traceback

MODE, OUT = sys.argv[1], sys.argv[2]
ONLY = sys.argv[3].split(",") if len(sys.argv) > 3 else None

if MODE != "compare":
    import kdist

    if MODE in ("mirrored", "upstream"):
        kdist.split_cpu(2)
    import keras
    import tensorflow as tf
import numpy as np

GLOBAL_BATCH = 16
EPOCHS = 2
rng = np.random.default_rng(0)
X = (rng.normal(size=(64, 8)) * np.linspace(0.5, 1.5, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(64, 1))).astype("float32")
LABELS = (X[:, 0] + X[:, 1] > 0).astype("int32")
NOISE = rng.normal(size=(64, 4)).astype("float32")  # a GAN's and a VAE's randomness, as data


# The fixes the upstream mode removes (kdist/keras_seam/one_device_fixes.py), and the idioms that show
# each bug.
UPSTREAM_FIXES = ("batch_norm_statistics_averaged", "clip_after_all_reduce",
                  "loss_value_per_replica", "gradient_accumulation_in_phases",
                  "loss_scale_finite_on_every_replica", "step_models_under_strategies",
                  "random_draws_as_one_device", "additional_loss_sums_as_one_device")


@contextlib.contextmanager
def scope():
    if MODE == "one_device":
        yield
        return
    # upstream: Keras as shipped, without kdist's check that would stop a drifting fit
    with kdist.scope(check_replicas="off" if MODE == "upstream" else "error") as strategy:
        if MODE == "upstream":
            from kdist.keras_seam import patches

            for name in UPSTREAM_FIXES:
                patches.patch(name).uninstall()
        yield strategy


def dense_model(*middle, outputs=1, seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), *middle,
                             keras.layers.Activation("relu"), keras.layers.Dense(outputs)])


def fit_regression(model_fn, optimizer_fn, inputs=None, **compile_args):
    """`model_fn()` compiled with `optimizer_fn()` and mse, fit and evaluated on `inputs` (X by
    default) against Y."""
    inputs = X if inputs is None else inputs
    with scope():
        model = model_fn()
        model.compile(optimizer_fn(), "mse", **compile_args)
    history = model.fit(inputs, Y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False,
                        verbose=0)
    return model, history.history, model.evaluate(inputs, Y, batch_size=GLOBAL_BATCH, verbose=0,
                                                  return_dict=True)


# ------------------------------------------------------------------------------------ idioms
def batchnorm():
    return fit_regression(lambda: dense_model(keras.layers.BatchNormalization()),
                          lambda: keras.optimizers.SGD(0.05))


def batchnorm_synchronized():
    return fit_regression(lambda: dense_model(keras.layers.BatchNormalization(synchronized=True)),
                          lambda: keras.optimizers.SGD(0.05))


def clipnorm_sgd():
    return fit_regression(dense_model, lambda: keras.optimizers.SGD(0.1, clipnorm=0.05))


def global_clipnorm_sgd():
    return fit_regression(dense_model, lambda: keras.optimizers.SGD(0.1, global_clipnorm=0.05))


def clipvalue_sgd():
    return fit_regression(dense_model, lambda: keras.optimizers.SGD(0.1, clipvalue=0.02))


def clipnorm_adam():
    return fit_regression(dense_model, lambda: keras.optimizers.Adam(0.01, clipnorm=0.5))


def gradient_accumulation_sgd():
    return fit_regression(dense_model,
                          lambda: keras.optimizers.SGD(0.05, gradient_accumulation_steps=2))


def gradient_accumulation_adam():
    return fit_regression(dense_model,
                          lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=2))


def regularizers():
    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01)),
            keras.layers.Dense(1, bias_regularizer=keras.regularizers.L1(0.01))])

    return fit_regression(model, lambda: keras.optimizers.SGD(0.05))


def activity_regularizer():
    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([
            keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, activity_regularizer=keras.regularizers.L1(0.01))])

    return fit_regression(model, lambda: keras.optimizers.SGD(0.05))


def adamw():
    return fit_regression(dense_model, lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05))


def learning_rate_schedule():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)
    return fit_regression(dense_model, lambda: keras.optimizers.SGD(schedule, momentum=0.5))


def steps_per_execution():
    return fit_regression(dense_model, lambda: keras.optimizers.SGD(0.05), steps_per_execution=2)


def ema():
    return fit_regression(dense_model, lambda: keras.optimizers.SGD(0.05, use_ema=True,
                                                                    ema_momentum=0.5))


def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        return fit_regression(lambda: dense_model(keras.layers.Activation("linear",
                                                                          dtype="float32")),
                              lambda: keras.optimizers.SGD(0.05))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def sample_weight():
    weights = np.linspace(0.1, 2.0, 64).astype("float32")
    with scope():
        model = dense_model()
        model.compile(keras.optimizers.SGD(0.05), "mse", weighted_metrics=["mae"])
    history = model.fit(X, Y, sample_weight=weights, batch_size=GLOBAL_BATCH, epochs=EPOCHS,
                        shuffle=False, verbose=0)
    return model, history.history, model.evaluate(X, Y, sample_weight=weights,
                                                  batch_size=GLOBAL_BATCH, verbose=0,
                                                  return_dict=True)


def classification_metrics():
    """The metrics that keep thresholds and confusion counts, with class_weight."""
    with scope():
        model = dense_model(outputs=1)
        model.add(keras.layers.Activation("sigmoid"))
        model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy",
                      metrics=["accuracy", keras.metrics.AUC(name="auc"),
                               keras.metrics.Precision(name="precision"),
                               keras.metrics.Recall(name="recall")])
    history = model.fit(X, LABELS, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False,
                        verbose=0, class_weight={0: 1.0, 1: 3.0})
    return model, history.history, model.evaluate(X, LABELS, batch_size=GLOBAL_BATCH, verbose=0,
                                                  return_dict=True)


def multi_output():
    with scope():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        model = keras.Model(inputs, {"value": keras.layers.Dense(1, name="value")(hidden),
                                     "label": keras.layers.Dense(2, name="label")(hidden)})
        model.compile(keras.optimizers.SGD(0.05),
                      loss={"value": "mse",
                            "label": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                      loss_weights={"value": 1.0, "label": 0.5},
                      metrics={"label": ["accuracy"]})
    targets = {"value": Y, "label": LABELS}
    history = model.fit(X, targets, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False,
                        verbose=0)
    return model, history.history, model.evaluate(X, targets, batch_size=GLOBAL_BATCH, verbose=0,
                                                  return_dict=True)


def dropout():
    """Each replica's masks are its rows of one device's masks for the global batch."""
    return fit_regression(lambda: dense_model(keras.layers.Dropout(0.3, seed=2)),
                          lambda: keras.optimizers.SGD(0.05))


def random_layers_uneven():
    """Every random layer of Keras on the batch, with a short last batch (61 rows: 7/6): noise,
    masks and a random flip drawn as one device draws them for the global batch."""
    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([
            keras.Input((8,)), keras.layers.Reshape((2, 4, 1)),
            keras.layers.RandomFlip("horizontal", seed=2), keras.layers.Flatten(),
            keras.layers.Dense(16), keras.layers.GaussianNoise(0.1, seed=3),
            keras.layers.Activation("relu"), keras.layers.GaussianDropout(0.2, seed=4),
            keras.layers.AlphaDropout(0.2, seed=5), keras.layers.Dropout(0.3, seed=6),
            keras.layers.Dense(1)])

    with scope():
        built = model()
        built.compile(keras.optimizers.Adam(0.01), "mse")
    history = built.fit(X[:61], Y[:61], batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False,
                        verbose=0)
    return built, history.history, built.evaluate(X[:61], Y[:61], batch_size=GLOBAL_BATCH,
                                                  verbose=0, return_dict=True)


def penalty(reduce):
    """A layer giving add_loss a penalty on its activations, reduced over the batch by `reduce`
    (`keras.ops.sum` or `keras.ops.mean`)."""
    class Penalty(keras.layers.Layer):
        def call(self, h):
            self.add_loss(1e-2 * reduce(keras.ops.sum(keras.ops.square(h), axis=1)))
            return h

    return Penalty()


def add_loss_sum():
    """A penalty summed over the batch, on uneven shares (61 rows: 7/6): each replica's sum is
    its part of one device's (Keras divides it by the replicas, as a mean)."""
    return fit_rows(61, GLOBAL_BATCH, middle=(penalty(keras.ops.sum),))


def add_loss_mean():
    return fit_rows(61, GLOBAL_BATCH, middle=(penalty(keras.ops.mean),))


def custom_train_step():
    """keras.io, "Customizing what happens in fit()": compute_loss, its own Mean trackers, a
    custom test_step."""

    class CustomModel(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.out = keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.hidden(x))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        def test_step(self, data):
            x, y = data
            y_pred = self(x, training=False)
            self.loss_tracker.update_state(self.compute_loss(y=y, y_pred=y_pred))
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        @property
        def metrics(self):
            return [self.loss_tracker, self.mae_metric]

    with scope():
        keras.utils.set_random_seed(1)
        model = CustomModel()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    history = model.fit(X, Y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return model, history.history, model.evaluate(X, Y, batch_size=GLOBAL_BATCH, verbose=0,
                                                  return_dict=True)


def custom_train_step_loss_object():
    """A train_step with its own loss object and a compiled metric (compute_metrics)."""

    class LossObjectModel(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.loss_fn = keras.losses.MeanSquaredError()
            self.tracker = keras.metrics.Mean(name="loss")
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.out = keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.hidden(x))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.loss_fn(y, self(x, training=True))
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                                 self.trainable_variables)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        @property
        def metrics(self):
            return [self.tracker]

    with scope():
        keras.utils.set_random_seed(1)
        model = LossObjectModel()
        model.compile(keras.optimizers.SGD(0.05))
    history = model.fit(X, Y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return model, history.history, {}


def gan_two_optimizers(noise_drawn_in_step=False):
    """keras.io's GAN pattern: two models, two optimizers, a custom train_step and trackers; the
    noise comes with the data, or is drawn inside the step as keras.io's GAN draws it."""

    class GAN(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            keras.utils.set_random_seed(1)
            self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, "relu"),
                                               keras.layers.Dense(8)])
            self.discriminator = keras.Sequential([keras.Input((8,)),
                                                   keras.layers.Dense(16, "relu"),
                                                   keras.layers.Dense(1)])
            self.seed_generator = keras.random.SeedGenerator(7)
            self.d_tracker = keras.metrics.Mean(name="d_loss")
            self.g_tracker = keras.metrics.Mean(name="g_loss")

        def compile(self, d_optimizer, g_optimizer):
            super().compile()
            self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
            self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

        @property
        def metrics(self):
            return [self.d_tracker, self.g_tracker]

        def train_step(self, data):
            real, noise = data
            if noise_drawn_in_step:
                noise = keras.random.normal((keras.ops.shape(real)[0], 4),
                                            seed=self.seed_generator)
            fake = self.generator(noise)
            both = tf.concat([fake, real], axis=0)
            labels = tf.concat([tf.ones_like(real[:, :1]), tf.zeros_like(real[:, :1])], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(both))
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(tf.zeros_like(real[:, :1]),
                                      self.discriminator(self.generator(noise)))
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply(grads, self.generator.trainable_weights)
            self.d_tracker.update_state(d_loss)
            self.g_tracker.update_state(g_loss)
            return {"d_loss": self.d_tracker.result(), "g_loss": self.g_tracker.result()}

    with scope():
        gan = GAN()
        gan.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3))
    # drawn in the step: batches of a static size (no collective to find the replica's rows)
    batches = tf.data.Dataset.from_tensor_slices((X, NOISE)).batch(
        GLOBAL_BATCH, drop_remainder=noise_drawn_in_step)
    history = gan.fit(batches, epochs=EPOCHS, verbose=0)
    return gan, history.history, {}


def gan_noise_drawn_in_step():
    return gan_two_optimizers(noise_drawn_in_step=True)


def vae():
    """keras.io's VAE: encoder, decoder, a KL term and three trackers (epsilon comes with the
    data, as the GAN's noise)."""

    class VAE(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            keras.utils.set_random_seed(1)
            self.encoder = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "relu"),
                                             keras.layers.Dense(8)])
            self.decoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, "relu"),
                                             keras.layers.Dense(8)])
            self.total_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_tracker = keras.metrics.Mean(name="reconstruction_loss")
            self.kl_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [self.total_tracker, self.reconstruction_tracker, self.kl_tracker]

        def train_step(self, data):
            x, epsilon = data
            with tf.GradientTape() as tape:
                z_mean, z_log_var = tf.split(self.encoder(x), 2, axis=1)
                z = z_mean + tf.exp(0.5 * z_log_var) * epsilon
                reconstruction_loss = tf.reduce_mean(
                    tf.reduce_sum(tf.square(x - self.decoder(z)), axis=1))
                kl_loss = tf.reduce_mean(tf.reduce_sum(
                    -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var)), axis=1))
                total_loss = reconstruction_loss + kl_loss
                scaled = total_loss / tf.distribute.get_strategy().num_replicas_in_sync
            grads = tape.gradient(scaled, self.trainable_weights)
            self.optimizer.apply(grads, self.trainable_weights)
            self.total_tracker.update_state(total_loss)
            self.reconstruction_tracker.update_state(reconstruction_loss)
            self.kl_tracker.update_state(kl_loss)
            return {m.name: m.result() for m in self.metrics}

    with scope():
        model = VAE()
        model.compile(keras.optimizers.Adam(1e-3))
    history = model.fit(tf.data.Dataset.from_tensor_slices((X, NOISE)).batch(GLOBAL_BATCH),
                        epochs=EPOCHS, verbose=0)
    return model, history.history, {}


def diverging_replicas():
    """BatchNormalization as Keras ships it (kdist's fix removed): each replica's statistics
    drift apart, and kdist's end-of-epoch check stops fit naming them and the replicas."""
    if MODE == "one_device":
        return batchnorm()
    from kdist.keras_seam import patches

    fix = patches.patch("batch_norm_statistics_averaged")
    try:
        with scope():
            fix.uninstall()
            model = dense_model(keras.layers.BatchNormalization())
            model.compile(keras.optimizers.SGD(0.05), "mse")
        model.fit(X, Y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    finally:
        fix.install()
    return model, {}, {}


def jit_compile():
    """XLA: TensorFlow cannot compile the all-reduce on CPU devices; kdist says so."""
    return fit_regression(dense_model, lambda: keras.optimizers.SGD(0.05), jit_compile=True)


# ------------------------------------------------------------- gradient types and uneven shares
TOKENS = (np.arange(64 * 6).reshape(64, 6) * 7 % 23).astype("int32")  # repeats in every batch


def embedding_sgd():
    """Embedding: its gradient is IndexedSlices, with indices repeated within and across rows."""
    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(23, 4),
                                 keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])

    return fit_regression(model, lambda: keras.optimizers.SGD(0.5), inputs=TOKENS)


def gather_dense_unused_adam():
    """A table read by tf.gather (IndexedSlices, repeated indices), a dense kernel, and a variable
    no loss reaches (no gradient)."""
    class GatherAndUnused(keras.layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=(8, 4), initializer="glorot_uniform", name="table")
            self.kernel = self.add_weight(shape=(8, 4), initializer="glorot_uniform",
                                          name="kernel")
            self.unused = self.add_weight(shape=(3,), initializer="ones", name="unused")

        def call(self, x):
            index = tf.cast(tf.abs(x[:, :2]) * 3, "int32") % 8
            return tf.reduce_mean(tf.gather(self.table, index), axis=1) + tf.matmul(x, self.kernel)

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((8,)), GatherAndUnused(), keras.layers.Dense(1)])

    return fit_regression(model, lambda: keras.optimizers.Adam(0.01))


def position_embedding_adam():
    """keras.io's Transformer embedding: tokens plus a position table looked up on
    `ops.arange(maxlen)`, indices that do not depend on the batch (each replica's gradient holds
    the same rows, one device's each row once, summed over the batch), with Adam, which squares
    a gradient's rows before repeated indices are merged."""
    class TokenAndPosition(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.tokens = keras.layers.Embedding(23, 4)
            self.positions = keras.layers.Embedding(6, 4)

        def call(self, x):
            return self.tokens(x) + self.positions(keras.ops.arange(0, x.shape[-1], 1))

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((6,), dtype="int32"), TokenAndPosition(),
                                 keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])

    return fit_regression(model, lambda: keras.optimizers.Adam(0.05), inputs=TOKENS)


def fit_rows(rows, batch, sample_weight=None, middle=()):
    with scope():
        model = dense_model(*middle)
        model.compile(keras.optimizers.SGD(0.05), "mse", weighted_metrics=["mae"])
    history = model.fit(X[:rows], Y[:rows], batch_size=batch, epochs=EPOCHS, shuffle=False,
                        verbose=0, sample_weight=sample_weight)
    return model, history.history, model.evaluate(X[:rows], Y[:rows], batch_size=batch,
                                                  verbose=0, return_dict=True)


def uneven_last_batch():
    """61 rows in batches of 16: the last batch of 13 splits 7/6."""
    return fit_rows(61, GLOBAL_BATCH)


def uneven_last_batch_weighted():
    return fit_rows(61, GLOBAL_BATCH, sample_weight=np.linspace(0.1, 2.0, 61).astype("float32"))


def one_row_last_batch():
    """49 rows: the last batch is one row, so one replica's share is empty."""
    return fit_rows(49, GLOBAL_BATCH)


def empty_share():
    """5 rows in batches of 2 (keras-team/keras#20712's shape): every last share is empty."""
    return fit_rows(5, 2)


def empty_share_broadcasting_loss():
    """keras-team/keras#20712's loss: targets of shape (N,) against 10 outputs, which mse
    broadcasts on one device when a batch has 1 row; a global batch of 1 leaves every other
    replica's share empty (0 rows do not broadcast against 10)."""
    with scope():
        model = dense_model(outputs=10)
        model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    history = model.fit(X[:5], Y[:5, 0], batch_size=1, epochs=EPOCHS, shuffle=False, verbose=0)
    return model, history.history, model.evaluate(X[:5], Y[:5, 0], batch_size=1, verbose=0,
                                                  return_dict=True)


def fit_pydataset(workers, use_multiprocessing=False, shuffle=False, batch=GLOBAL_BATCH,
                  unseeded=False):
    """A keras.utils.PyDataset of global batches, loaded by `workers` threads (or processes);
    `unseeded`: Python's random drawn from the process once the model is built."""
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return len(X) // batch

        def __getitem__(self, index):
            rows = slice(index * batch, (index + 1) * batch)
            return X[rows], Y[rows]

    with scope():
        model = dense_model()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    data = Batches(workers=workers, use_multiprocessing=use_multiprocessing)
    if unseeded:
        import random

        random.seed(os.urandom(8))
    history = model.fit(data, epochs=EPOCHS, shuffle=shuffle, verbose=0)
    return model, history.history, model.evaluate(data, verbose=0, return_dict=True)


def pydataset():
    return fit_pydataset(workers=1)


def pydataset_two_workers():
    return fit_pydataset(workers=2)


def pydataset_shuffled():
    """fit(shuffle=True) over 8 batches, 2 loader threads: each epoch in the order Keras draws
    from Python's random on one device (seeded by keras.utils.set_random_seed)."""
    return fit_pydataset(workers=2, shuffle=True, batch=8)


def pydataset_shuffled_unseeded():
    """The same with Python's random left unseeded (drawn from the process): the workers still
    take one order, a shared seed's, and say so."""
    return fit_pydataset(workers=2, shuffle=True, batch=8, unseeded=True)


def fit_generator(rows, steps_per_execution=1, **fit_args):
    """A Python generator of global batches over the first `rows` rows (49: the last batch is
    one row, so one replica's share is empty), evaluated on a finite one."""
    def batches(forever):
        while True:
            for start in range(0, rows, GLOBAL_BATCH):
                yield X[start:start + GLOBAL_BATCH], Y[start:start + GLOBAL_BATCH]
            if not forever:
                return

    with scope():
        model = dense_model()
        model.compile(keras.optimizers.SGD(0.05), "mse", weighted_metrics=["mae"],
                      steps_per_execution=steps_per_execution)
    history = model.fit(batches(forever="steps_per_epoch" in fit_args), verbose=0, **fit_args)
    return model, history.history, model.evaluate(batches(forever=False), verbose=0,
                                                  return_dict=True)


def generator_steps_per_epoch():
    """An endless generator, `steps_per_epoch` batches an epoch (the tutorials' way)."""
    return fit_generator(49, steps_per_epoch=4, epochs=EPOCHS)


def generator_to_its_end():
    """A generator that ends: the epoch ends when its data does, on every worker at once."""
    return fit_generator(49, epochs=1)


def generator_to_its_end_in_executions():
    """The same in executions of 3 steps: the data ends inside the second execution."""
    return fit_generator(49, steps_per_execution=3, epochs=1)


# ------------------------------------------------- epoch after epoch: sources that reshuffle
RESHUFFLED_EPOCHS = 3


def fit_epochs(model_fn, data, evaluation, loss="mse"):
    """`model_fn()` fit for RESHUFFLED_EPOCHS epochs on `data` (a source that reshuffles itself
    each epoch), then evaluated on `evaluation`."""
    with scope():
        model = model_fn()
        model.compile(keras.optimizers.SGD(0.05), loss)
    history = model.fit(data, epochs=RESHUFFLED_EPOCHS, verbose=0)
    return model, history.history, model.evaluate(evaluation, verbose=0, return_dict=True)


def numpy_shuffled():
    """fit(x, y, shuffle=True): seeded, Keras draws the same permutation of the rows at every
    epoch (kdist.keras_seam.inputs.keras_order)."""
    return fit_numpy_shuffled(True)


def fit_numpy_shuffled(shuffle):
    with scope():
        model = dense_model()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    history = model.fit(X, Y, batch_size=GLOBAL_BATCH, epochs=RESHUFFLED_EPOCHS, shuffle=shuffle,
                        verbose=0)
    return model, history.history, model.evaluate(X, Y, batch_size=GLOBAL_BATCH, verbose=0,
                                                  return_dict=True)


def numpy_shuffled_by_batch():
    """fit(shuffle="batch"): batches in a new order each epoch, rows shuffled within them."""
    return fit_numpy_shuffled("batch")


def tfdata_reshuffled():
    """keras.io's pipeline: `shuffle(64, seed=7)` (reshuffled each iteration), no repeat."""
    data = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(64, seed=7).batch(GLOBAL_BATCH)
    return fit_epochs(dense_model, data,
                      tf.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL_BATCH))


def own_folder(name):
    """A folder of this process's own (two workers may share OUT)."""
    folder = os.path.join(OUT, "files", f"{MODE}-{os.getpid()}", name)
    os.makedirs(folder, exist_ok=True)
    return folder


def image_folder_reshuffled():
    """keras.utils.image_dataset_from_directory(shuffle=True, seed=...) over PNG files on disk
    (two classes of 8x8 images), a Rescaling layer, 3 epochs."""
    root = own_folder("images")
    pixels = np.random.default_rng(3).integers(0, 256, (40, 8, 8, 3)).astype("uint8")
    for k, image in enumerate(pixels):
        label = "bright" if image.mean() > 127 else "dark"
        os.makedirs(os.path.join(root, label), exist_ok=True)
        keras.utils.save_img(os.path.join(root, label, f"{k:02d}.png"), image)
    data = keras.utils.image_dataset_from_directory(root, image_size=(8, 8), batch_size=8,
                                                    shuffle=True, seed=11, verbose=False)

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255),
                                 keras.layers.Flatten(), keras.layers.Dense(8, "relu"),
                                 keras.layers.Dense(1)])

    return fit_epochs(model, data, data, loss=keras.losses.BinaryCrossentropy(from_logits=True))


def text_folder_reshuffled():
    """keras.utils.text_dataset_from_directory(shuffle=True, seed=...) over text files on disk,
    a TextVectorization adapted on the training texts, 3 epochs."""
    root = own_folder("texts")
    words = ["good", "bad", "fine", "poor", "great", "awful", "ok", "meh"]
    rng_text = np.random.default_rng(4)
    for k in range(40):
        label = "pos" if k % 2 else "neg"
        os.makedirs(os.path.join(root, label), exist_ok=True)
        with open(os.path.join(root, label, f"{k:02d}.txt"), "w") as f:
            f.write(" ".join(rng_text.choice(words[k % 2::2] + words[-2:], 6)))
    data = keras.utils.text_dataset_from_directory(root, batch_size=8, shuffle=True, seed=5,
                                                   verbose=False)
    vectorize = keras.layers.TextVectorization(max_tokens=12, output_sequence_length=6)
    vectorize.adapt(data.map(lambda text, label: text))
    tokens = data.map(lambda text, label: (vectorize(text), label))

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((6,), dtype="int64"), keras.layers.Embedding(12, 4),
                                 keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])

    return fit_epochs(model, tokens, tokens, loss=keras.losses.BinaryCrossentropy(from_logits=True))


def adapted_columns_reshuffled():
    """A dict of columns shuffled with a seed; a Normalization and a StringLookup adapted on the
    training dataset (keras.io's structured-data recipe), 3 epochs."""
    colours = np.array(["red", "green", "blue", "grey"])[(np.abs(X[:, 2]) * 3).astype(int) % 4]
    columns = {"number": X[:, :1], "colour": colours[:, None]}
    data = tf.data.Dataset.from_tensor_slices((columns, Y)).shuffle(64, seed=9).batch(GLOBAL_BATCH)
    normalize = keras.layers.Normalization()
    normalize.adapt(data.map(lambda features, target: features["number"]))
    lookup = keras.layers.StringLookup(output_mode="one_hot")
    lookup.adapt(data.map(lambda features, target: features["colour"]))
    encoded = data.map(lambda features, target: (
        tf.concat([normalize(features["number"]), tf.cast(lookup(features["colour"]), "float32")], 1),
        target))
    width = 1 + lookup.vocabulary_size()

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((width,)), keras.layers.Dense(8, "relu"),
                                 keras.layers.Dense(1)])

    return fit_epochs(model, encoded, encoded)


def timeseries_reshuffled():
    """keras.utils.timeseries_dataset_from_array(shuffle=True, seed=...) into an LSTM."""
    series = (np.cumsum(np.random.default_rng(6).normal(size=(120, 2)), 0) / 10).astype("float32")
    data = keras.utils.timeseries_dataset_from_array(series[:-5], series[5:, :1],
                                                     sequence_length=5, batch_size=16,
                                                     shuffle=True, seed=13)

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((5, 2)), keras.layers.LSTM(4), keras.layers.Dense(1)])

    return fit_epochs(model, data, data)


def pydataset_reshuffling_itself():
    """A PyDataset that reshuffles its own rows in `on_epoch_end`, loaded by 2 threads."""
    class Reshuffled(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=2)
            self.order = np.arange(len(X))
            self.draws = np.random.default_rng(8)

        def __len__(self):
            return len(X) // GLOBAL_BATCH

        def __getitem__(self, index):
            rows = self.order[index * GLOBAL_BATCH:(index + 1) * GLOBAL_BATCH]
            return X[rows], Y[rows]

        def on_epoch_end(self):
            self.order = self.draws.permutation(len(X))

    return fit_epochs(dense_model, Reshuffled(),
                      tf.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL_BATCH))


IDIOMS = [batchnorm, batchnorm_synchronized, clipnorm_sgd, global_clipnorm_sgd, clipvalue_sgd,
          clipnorm_adam, gradient_accumulation_sgd, gradient_accumulation_adam, regularizers,
          activity_regularizer, adamw, learning_rate_schedule, steps_per_execution, ema, mixed_float16, sample_weight,
          classification_metrics, multi_output, dropout, random_layers_uneven, add_loss_sum,
          add_loss_mean, custom_train_step,
          custom_train_step_loss_object, gan_two_optimizers, gan_noise_drawn_in_step, vae, diverging_replicas, jit_compile,
          embedding_sgd, position_embedding_adam, gather_dense_unused_adam, uneven_last_batch,
          uneven_last_batch_weighted, one_row_last_batch, empty_share,
          empty_share_broadcasting_loss, pydataset, pydataset_two_workers, pydataset_shuffled,
          pydataset_shuffled_unseeded,
          generator_steps_per_epoch, generator_to_its_end, generator_to_its_end_in_executions,
          numpy_shuffled, numpy_shuffled_by_batch, tfdata_reshuffled, image_folder_reshuffled,
          text_folder_reshuffled, adapted_columns_reshuffled, timeseries_reshuffled,
          pydataset_reshuffling_itself]


# ------------------------------------------------------------------------------------ running
def variables_of(model):
    """Every variable of the model and its optimizers, in order, by position and name (paths
    carry counters that depend on what ran before; Keras's accumulators hold one replica's
    partial sums by design and are left out)."""
    optimizers = [getattr(model, "d_optimizer", None), getattr(model, "g_optimizer", None)]
    if optimizers == [None, None]:  # a GAN's compiled optimizer is unused
        optimizers = [model.optimizer]
    optimizers = [optimizer for optimizer in optimizers if optimizer is not None]
    found = list(model.weights) + [v for optimizer in optimizers for v in optimizer.variables
                                   if "accumulator" not in v.path]
    return {f"{k:03d}:{variable.name}": variable for k, variable in enumerate(found)}


def replica_difference(variables) -> tuple[float, str | None]:
    """The largest difference between two replicas' copies of any variable in this process."""
    strategy = kdist.current_strategy() if MODE != "one_device" else None
    worst, name = 0.0, None
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return worst, name
    for path, variable in variables.items():
        copies = strategy.experimental_local_results(variable.value)
        if len(copies) < 2 or getattr(variable.value, "synchronization", None) == \
                tf.VariableSynchronization.ON_READ:
            continue
        difference = max(float(np.abs(np.asarray(c) - np.asarray(copies[0])).max())
                         for c in copies[1:])
        if difference > worst:
            worst, name = difference, path
    return worst, name


class Said(logging.Handler):
    """What kdist logged while an idiom ran (its warnings are part of the outcome)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def run(idiom, folder):
    said = Said()
    logging.getLogger("kdist").addHandler(said)
    try:
        model, history, evaluation = idiom()
    except Exception as error:  # the outcome under test: reported, the next idiom goes on
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:8000],
                "trace": traceback.format_exc()[-2000:], "warnings": said.lines}
    finally:
        logging.getLogger("kdist").removeHandler(said)
    variables = variables_of(model)
    np.savez(os.path.join(folder, f"{idiom.__name__}.npz"),
             **{path: np.asarray(v.numpy(), dtype="float64") for path, v in variables.items()})
    difference, where = replica_difference(variables)
    return {"ok": True, "history": {k: [float(x) for x in v] for k, v in history.items()},
            "evaluate": {k: float(v) for k, v in evaluation.items()},
            "replica_difference": difference, "replica_difference_at": where,
            "warnings": said.lines}


def main():
    task = ""
    if MODE == "multi_worker":
        kdist.strategy()  # before the first TensorFlow op, as the tutorials' order allows anyway
        spec = kdist.cluster()
        task = f"-{spec.task_type}{spec.task_index}"
    folder = os.path.join(OUT, MODE + task)
    os.makedirs(folder, exist_ok=True)
    report = {idiom.__name__: run(idiom, folder) for idiom in IDIOMS
              if ONLY is None or idiom.__name__ in ONLY}
    with open(folder + ".json", "w") as f:
        json.dump(report, f, indent=1)
    print(f"idioms {MODE}{task}: {sum(r['ok'] for r in report.values())}/{len(report)} trained")


def largest_difference(first: dict, second: dict) -> float:
    return max((float(np.abs(first[k] - second[k]).max()) for k in first.files), default=0.0)


def compare():
    """Each idiom's largest weight difference from one device, and whether it trained."""
    one = json.load(open(os.path.join(OUT, "one_device.json")))
    for mode in ("mirrored", "multi_worker-worker0"):
        path = os.path.join(OUT, mode + ".json")
        if not os.path.exists(path):
            continue
        report = json.load(open(path))
        print(f"\n{mode}: idiom, weights vs one device, logs vs one device, replicas")
        for name, outcome in report.items():
            if not outcome["ok"] or not one[name]["ok"]:
                print(f"  {name:32s} {outcome.get('error', one[name].get('error', ''))[:90]}")
                continue
            weights = largest_difference(np.load(os.path.join(OUT, "one_device", name + ".npz")),
                                         np.load(os.path.join(OUT, mode, name + ".npz")))
            logs = max((abs(a - b) for key, values in one[name]["history"].items()
                        for a, b in zip(values, outcome["history"].get(key, [np.inf]))),
                       default=0.0)
            print(f"  {name:32s} {weights:10.2e} {logs:10.2e} {outcome['replica_difference']:10.2e}")


if __name__ == "__main__":
    compare() if MODE == "compare" else main()
