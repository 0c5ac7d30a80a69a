"""The upstream bugs that make N synchronous replicas train differently from one device with the
global batch, each a `Patch` of kind `FIX` registered in `kdist.keras_seam.fixes.FIXES`.

The promise of synchronous data parallelism is that N replicas with batch b are one device with
batch N x b. Keras 3 on tf.distribute breaks it in four places (measured with TF 2.21 / Keras 3.15
on 2 replicas, each compared with one device):

1. `BatchNormalization`'s moving statistics are created without an aggregation, so each replica
   updates its own copy from its own half of the batch: the replicas (and workers) end with
   different statistics (up to 0.35 apart), and what is saved or evaluated depends on which one
   is read. kdist creates them with the mean aggregation tf.keras 2 used: every replica assigns
   the mean over the replicas of the values it computed, so all hold the same statistics
   (`synchronized=True` already computes them from the global batch and needs no more).
2. Gradient clipping (`clipnorm`, `global_clipnorm`, `clipvalue`) runs on each replica's share of
   the gradient, before the all-reduce: the sum of clipped parts is not the clipped sum one device
   computes. kdist clips after the sum (as tf.keras 2 did from TF 2.2, tensorflow#33929).
3. Keras >= 3.8 divides each replica's loss by the replicas in sync inside the loss itself
   (keras-team/keras#20609), so the value a custom `train_step` gets from `compute_loss` (or a
   loss object) is 1/N of the loss it tracks on one device, and its `Mean` tracker, `fit`'s logs
   and `evaluate` report 1/N of the loss. kdist keeps the value and divides its gradient instead:
   the same gradients, and the values one device computes.
4. `gradient_accumulation_steps` puts the all-reduce inside a `tf.cond`, which tf.distribute
   rejects (keras-team/keras#20582). kdist runs the two branches as two traced phases, chosen
   before each step (`kdist.exchange.phases.PhaseCallback`, asked through the hook
   `accumulation_phase`), so no collective sits inside a condition.
5. `LossScaleOptimizer` (mixed precision) decides whether a step's gradients are finite from the
   first replica's part alone, before they are summed: when another replica's part overflowed,
   the sum holds inf and is applied (measured: a kernel at -inf after one step under 2 replicas).
   kdist makes every replica decide on all of them (a count over the replicas), as one device
   decides on the whole gradient.
6. A model that is only a `train_step` over sub-models (keras.io's GAN: no `call()`, optimizers
   of its own) trains on one device, where Keras builds it lazily, and fails under any strategy,
   where Keras builds it from the first batch by calling it (keras-team/keras#20164). kdist takes
   such a model as built once its sub-models are, and builds an optimizer first used inside the
   step in the cross-replica context, where tf.distribute creates variables.
7. Random draws (`Dropout`, `GaussianNoise`, the random preprocessing layers, `keras.random.*` in
   a `train_step`) take their seed from a `SeedGenerator` whose state every replica holds the
   same: each replica draws the same numbers for its share, so a global batch of 2 x 32 sees 32
   distinct dropout masks where one device draws 64 (measured: an MLP with Dropout and
   GaussianNoise 0.017 off one device after 2 epochs). TensorFlow's stateless draws are counter
   based: the first n rows of a draw of shape (m, ...) are the first n rows of any larger one with
   the same seed. A replica whose share starts at row o of the global batch (asked through the
   hook `draw_offset`) draws o + n rows and keeps its last n: one device's rows of the draw for
   the global batch. A draw whose first dimension is not the batch's stays as Keras makes it.
8. A loss given to `add_loss` is divided by the replicas (Keras >= 3.8), which is one device's
   only for a loss that averages over the batch (or does not depend on it: a regularizer of the
   weights): a penalty that sums over each replica's rows was already a part of one device's
   sum, and its gradient is 1/N of one device's (measured: 1e-3 * ops.sum(ops.square(h)) 0.011
   off after 2 epochs). The hook `additional_loss_factor` reads from the traced graph how the
   loss depends on the batch, and kdist multiplies a sum (its gradient and the value fit logs)
   by N, or by B / b where kdist weighs each replica's gradient by its b rows of the B.
"""

from __future__ import annotations

import functools
import threading

from kdist.keras_seam import versions
from kdist.keras_seam.hooks import connected
from kdist.keras_seam.strategy_kinds import is_parameter_server


def sums_replicas() -> bool:
    """Whether the code running now is one replica of several whose gradients are summed (a
    replica context of Mirrored or MultiWorkerMirrored with more than one replica in sync)."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return (context is not None and context.num_replicas_in_sync > 1
            and not is_parameter_server(context.strategy))


# ----------------------------------------------------------------------------------------------
# 1. BatchNormalization's moving statistics: the mean over the replicas, on every replica.
def _statistics_averaged(original):
    @functools.wraps(original)
    def build(self, input_shape):
        import tensorflow as tf

        if self.synchronized:  # computed from the global batch: equal on every replica already
            return original(self, input_shape)

        def creator(next_creator, **kwargs):
            if not kwargs.get("trainable", True):
                kwargs["aggregation"] = tf.VariableAggregation.MEAN
            return next_creator(**kwargs)

        with tf.variable_creator_scope(creator):
            original(self, input_shape)
        for variable in self.non_trainable_variables:
            if variable._value is None:  # deferred (a stateless scope): created later by Keras,
                variable._aggregation = "mean"  # which maps the name (Keras >= 3.6)

    return build


# ----------------------------------------------------------------------------------------------
# 2. Clipping after the sum: deferred on a replica, applied to what the exchange returns.
_clipping = threading.local()  # per replica thread: True while the summed gradients are clipped


def _clip_deferred(original):
    @functools.wraps(original)
    def _clip_gradients(self, grads):
        if sums_replicas() and not getattr(_clipping, "summed", False):
            return list(grads)
        return original(self, grads)

    return _clip_gradients


def _clip_summed(original):
    @functools.wraps(original)
    def _all_reduce_sum_gradients(self, grads_and_vars):
        summed = list(original(self, grads_and_vars))
        if not sums_replicas():
            return summed
        present = [k for k, (grad, _) in enumerate(summed) if grad is not None]
        _clipping.summed = True
        try:
            clipped = self._clip_gradients([summed[k][0] for k in present])
        finally:
            _clipping.summed = False
        for k, grad in zip(present, clipped):
            summed[k] = (grad, summed[k][1])
        return summed

    return _all_reduce_sum_gradients


# ----------------------------------------------------------------------------------------------
# 3. The loss a replica computes keeps its value; its gradient is divided by the replicas.
def _gradient_scaled(value, factor: float):
    import tensorflow as tf

    @tf.custom_gradient
    def scaled(x):
        return tf.identity(x), lambda upstream: upstream * tf.cast(factor, upstream.dtype)

    return scaled(value)


def _scale_gradient_only(original):
    @functools.wraps(original)
    def scale_loss_for_distribution(value):
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas == 1:
            return value
        connected().loss_divided()
        return _gradient_scaled(value, 1.0 / replicas)

    return scale_loss_for_distribution


def _unscaled_already(original):
    @functools.wraps(original)
    def unscale_loss_for_distribution(value):
        return value  # scale_loss_for_distribution kept the value

    return unscale_loss_for_distribution


# ----------------------------------------------------------------------------------------------
# 4. gradient_accumulation_steps in two traced phases instead of a cond around the all-reduce.
def _accumulation_in_phases(original):
    @functools.wraps(original)
    def _backend_apply_gradients(self, grads, trainable_variables):
        steps = self.gradient_accumulation_steps
        if not steps or not sums_replicas():
            return original(self, grads, trainable_variables)
        accumulate = connected().accumulation_phase(self)
        if accumulate is None:
            raise ValueError(
                f"gradient_accumulation_steps={steps} with {_replicas()} replicas: Keras sums the "
                "gradients inside a condition, which tf.distribute cannot run "
                "(keras-team/keras#20582). kdist runs it in two phases chosen before each step: "
                "compile the model inside kdist.scope() and train it with fit(); in a custom "
                "loop, accumulate the gradients yourself and call apply() every k steps")
        if self.use_ema:
            raise ValueError("gradient_accumulation_steps with use_ema=True under several "
                             "replicas is not supported by kdist: drop one of them")
        accumulators = [self._accumulated_gradients[self._get_variable_index(variable)]
                        for variable in trainable_variables]
        if accumulate:
            self._backend_increment_gradient_accumulators(grads, accumulators)
        else:  # Keras's update branch, as one device runs it on the step that completes the k
            mean = [(grad + accumulator) / steps for grad, accumulator in zip(grads, accumulators)]
            mean = self._clip_gradients(mean)
            self._apply_weight_decay(trainable_variables)
            self._backend_update_step(mean, trainable_variables, self.learning_rate)
            self._backend_reset_gradient_accumulators()
        if versions.for_running_keras(_COUNTS_IN_BACKEND_APPLY):
            self._iterations.assign_add(1)
        return None

    return _backend_apply_gradients


# Where Keras counts a step: at the end of `_backend_apply_gradients` up to 3.9, in `apply` after
# it from 3.10.
_COUNTS_IN_BACKEND_APPLY = {("3.0.0", "3.9.99"): True, ("3.10.0", versions.KERAS_RANGE[1]): False}


# ----------------------------------------------------------------------------------------------
# 5. Mixed precision: finite on every replica, or on none.
def _finite_everywhere(original):
    @functools.wraps(original)
    def check_finite(self, grads):
        import tensorflow as tf

        finite = original(self, grads)
        if not sums_replicas():
            return finite
        overflowed = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32))
        return tf.equal(overflowed, 0.0)  # ReduceOp has no MIN: count the replicas that were not

    return check_finite


# ----------------------------------------------------------------------------------------------
# 6. Models that are only a train_step, and optimizers built inside the step.
def _step_model_built(original):
    @functools.wraps(original)
    def _symbolic_build(self, *args, **kwargs):
        import keras

        no_call = getattr(type(self), "call", None) is keras.Model.call
        if no_call and not self.built and all(
                layer.built for layer in self._flatten_layers(include_self=False)):
            self.built = True  # nothing to call: its sub-models hold every variable
        return original(self, *args, **kwargs)

    return _symbolic_build


def _built_across_replicas(original):
    @functools.wraps(original)
    def apply(self, grads, trainable_variables=None):
        import tensorflow as tf

        if not self.built and trainable_variables is not None and sums_replicas():
            variables = list(trainable_variables)

            def build(strategy):
                with tf.init_scope(), strategy.scope():
                    self.build(variables)

            tf.distribute.get_replica_context().merge_call(build)
        return original(self, grads, trainable_variables)

    return apply


def _replicas() -> int:
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync


# ----------------------------------------------------------------------------------------------
# 7. Random draws: each replica's own rows of one device's draw for the global batch.
def _rows_of_one_device(original):
    """A draw whose first argument is its shape (`normal`, `uniform`, `randint`, ...)."""
    @functools.wraps(original)
    def draw(shape, *args, **kwargs):
        import tensorflow as tf

        offset = _draw_offset(shape[0])
        if offset is None:
            return original(shape, *args, **kwargs)
        if isinstance(shape, (list, tuple)):
            longer = [offset + shape[0], *shape[1:]]
        else:  # a shape tensor
            longer = tf.concat([[offset + shape[0]], shape[1:]], axis=0)
        return original(longer, *args, **kwargs)[offset:]

    return draw


def _dropout_rows_of_one_device(original):
    @functools.wraps(original)
    def dropout(inputs, rate, noise_shape=None, seed=None):
        import tensorflow as tf

        inputs = tf.convert_to_tensor(inputs)
        along_batch = noise_shape is None or noise_shape[0] is None
        rows = inputs.shape[0] if inputs.shape[0] is not None else tf.shape(inputs)[0]
        offset = _draw_offset(rows) if along_batch and inputs.shape.rank else None
        if offset is None:
            return original(inputs, rate, noise_shape=noise_shape, seed=seed)
        # zero rows in front of the replica's own: the mask of the global batch's first rows
        before = tf.zeros(tf.concat([[offset], tf.shape(inputs)[1:]], axis=0), inputs.dtype)
        dropped = original(tf.concat([before, inputs], axis=0), rate, noise_shape=noise_shape,
                           seed=seed)[offset:]
        dropped.set_shape(inputs.shape)
        return dropped

    return dropout


# ----------------------------------------------------------------------------------------------
# 8. add_loss: a sum over the batch is not divided by the replicas.
def _additional_loss_as_one_device(original):
    @functools.wraps(original)
    def _aggregate_additional_loss(self, loss):
        aggregated = original(self, loss)
        if not sums_replicas():
            return aggregated
        import tensorflow as tf

        factor = connected().additional_loss_factor(self, loss)
        if isinstance(factor, int) and factor == 1:
            return aggregated
        return aggregated * tf.cast(factor, aggregated.dtype)  # its value, logged, as its gradient

    return _aggregate_additional_loss


def _draw_offset(first_dimension):
    """Where this replica's rows start in one device's draw, when a draw's first dimension is
    the replica's share of the batch (the hook decides); None: the draw stays Keras's."""
    if not sums_replicas():
        return None
    offset = connected().draw_offset(first_dimension)
    if offset is None:
        return None
    import tensorflow as tf

    if isinstance(first_dimension, tf.Tensor):
        return tf.cast(offset, first_dimension.dtype)
    return tf.cast(offset, tf.int32)


# ----------------------------------------------------------------------------------------------
# Keras 2 names a Keras 3 user meets in the TensorFlow tutorials.
class Keras2Names:
    """`keras.utils.experimental`: gone in Keras 3. Asking it for a name says what to write."""

    INSTEAD = {
        "DatasetCreator": "pass the dataset function itself: model.fit(dataset_fn, epochs=..., "
                          "steps_per_epoch=...) (under ParameterServerStrategy kdist calls it "
                          "with the InputContext on every worker)",
    }

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        fix = self.INSTEAD.get(name, "see the Keras 3 migration guide")
        raise AttributeError(f"keras.utils.experimental.{name} is Keras 2's (tf.keras), and "
                             f"Keras 3 has no keras.utils.experimental. Instead: {fix}")


def _keras2_names(original):
    from kdist.keras_seam.registry import ABSENT

    return Keras2Names() if original is ABSENT else original
