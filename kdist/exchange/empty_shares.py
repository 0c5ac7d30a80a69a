"""A replica whose share of the global batch is empty computes no loss and updates no metric.

One device never sees a batch of 0 rows; under uneven shares a replica can (a last batch of 1 row
on 2 replicas). Its gradient is weighed by its 0 examples (`kdist.exchange.weights`), but the
user's loss and metrics still ran on 0 rows, and a loss that works on one device may fail there:
targets of shape (N,) against outputs (N, 10) broadcast when N is 1, never when N is 0
(`Incompatible shapes: [0] vs. [0,10]`, keras-team/keras#20712's program). So on an empty share
`compute_loss` gives zeros and `compute_metrics` reads the metrics without updating them, inside a
`tf.cond` on the recorded batch size (or without tracing them at all where the share is empty in
every step's shapes: a global batch of 1 row); the forward pass and every collective of the step
still run on every replica. Both wrap the model's own methods (Keras's, or the user's overrides), so a
custom `train_step` that calls them is covered too.
"""

from __future__ import annotations

import functools
import inspect

from kdist.exchange import weights
from kdist.keras_seam import keras_internals


def skipping_loss(compute_loss):
    """`compute_loss`, giving zeros of its dtype and static shape on an empty share."""
    signature = inspect.signature(compute_loss)

    @functools.wraps(compute_loss)
    def guarded(*args, **kwargs):
        examples = weights.recorded_batch_size()
        if examples is None:
            return compute_loss(*args, **kwargs)
        import tensorflow as tf

        y_pred = signature.bind(*args, **kwargs).arguments.get("y_pred")
        if tf.get_static_value(examples) == 0 and y_pred is not None:
            return _no_loss(y_pred)  # empty at every step: the loss is not even traced
        traced = []

        def loss():
            value = tf.convert_to_tensor(compute_loss(*args, **kwargs))
            traced.append(value)
            return value

        def no_loss():  # traced after `loss` (tf.cond traces the true branch first)
            shape = [size or 0 for size in traced[0].shape.as_list()]
            return tf.zeros(shape, traced[0].dtype)

        return tf.cond(examples > 0, loss, no_loss)

    return guarded


def _no_loss(y_pred):
    """A zero loss whose gradient reaches the model through its (empty) outputs, as a loss over
    0 rows does: every replica's step then has the same gradients, zeros here."""
    import keras
    import tensorflow as tf

    outputs = [tf.reduce_sum(tf.cast(t, keras.backend.floatx())) for t in tf.nest.flatten(y_pred)
               if t.dtype.is_floating]
    return 0.0 * tf.add_n(outputs) if outputs else tf.zeros([], keras.backend.floatx())


def skipping_metrics(compute_metrics):
    """`compute_metrics`, reading the model's metrics without updating them on an empty share."""
    model = keras_internals.model_of(compute_metrics)

    @functools.wraps(compute_metrics)
    def guarded(*args, **kwargs):
        examples = weights.recorded_batch_size()
        if examples is None:
            return compute_metrics(*args, **kwargs)
        import tensorflow as tf

        if tf.get_static_value(examples) == 0:
            return model.get_metrics_result()
        return tf.cond(examples > 0, lambda: compute_metrics(*args, **kwargs),
                       model.get_metrics_result)

    return guarded
