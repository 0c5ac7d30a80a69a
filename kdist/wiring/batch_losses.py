"""How a loss given to `add_loss` depends on the batch, read from the traced graph.

Keras (>= 3.8) divides each replica's `add_loss` values by the N replicas, which gives one
device's gradient for a loss that averages over the batch (the mean of N equal shares' means is
the global mean) or does not depend on it (each replica adds the same value). A loss that sums
over the batch is, on each replica, the sum over its own rows: one device's sum is the sum of
the replicas' sums, so its gradient must not be divided (measured: 1/N of one device's). The
seam's fix (`kdist.keras_seam.one_device_fixes`, 8) multiplies such a loss by N (`factor`).

`over_the_batch(loss)` walks the graph back from the loss: constants and variables' values do
not depend on the batch (`kdist.exchange.same_rows`); the first reduction that takes the rows
away decides, `Sum` or `Mean` (a loss of rank >= 1 that keeps them is summed by Keras); between
it and the loss only linear steps are allowed (a constant factor, a cast, a sum of terms that
agree), and a division by the batch size (`ops.shape(h)[0]`, or the replica's static batch)
turns a sum into a mean. Anything else (`ops.sqrt` of a sum, a product of two batch terms) is
neither: Keras's division stays, and kdist says once per model that it cannot read the loss.

>>> import tensorflow as tf
>>> from keras import ops
>>> found, w = [], tf.Variable(tf.ones([2, 2]))
>>> @tf.function(input_signature=[tf.TensorSpec([None, 2])])  # a batch of any size
... def probe(h):
...     found.extend(over_the_batch(loss)[0] for loss in (
...         1e-3 * ops.sum(ops.square(h)), ops.mean(ops.sum(h, axis=1)),
...         ops.sum(h) / ops.cast(ops.shape(h)[0], "float32"), ops.square(h),
...         ops.sum(ops.square(w)), ops.sqrt(ops.sum(ops.square(h))), ops.sum(h, axis=1)[0]))
>>> probe(tf.ones([3, 2]))
>>> found
['sum', 'mean', 'mean', 'sum', 'independent', 'unread', 'unread']
"""

from __future__ import annotations

import logging
import weakref

from kdist.exchange import same_rows, weights
from kdist.wiring import replica_rows

logger = logging.getLogger("kdist")

INDEPENDENT, SUM, MEAN, UNREAD = "independent", "sum", "mean", "unread"
PASSING = frozenset({"Identity", "Cast", "Neg", "Reshape", "Squeeze", "ExpandDims"})
ADDING = frozenset({"AddV2", "Add", "Sub", "AddN"})
DIVIDING = frozenset({"RealDiv", "Div", "DivNoNan", "TrueDiv"})
_said: weakref.WeakSet = weakref.WeakSet()


def factor(model, loss, replicas: int):
    """By what to multiply `loss` (its gradient divided by `replicas` by Keras) so that the
    replicas' gradients sum to one device's, and their values average (weighed by their rows,
    as fit logs the loss) to one device's: for a sum over the batch `replicas`, or where kdist
    weighs each replica's gradient by its rows (`kdist.exchange.weights`: b_i x replicas, the
    sum then divided by the global batch's B rows) B / b_i (0 for an empty share); else 1."""
    import tensorflow as tf

    if tf.executing_eagerly():  # run_eagerly=True: no graph to read, Keras's division
        return 1
    kind, why = over_the_batch(loss)
    if kind == SUM:
        rows = weights.weighed_batch_size()
        total = replica_rows.global_rows(replica_rows.SUMS) if rows is not None else None
        if total is None:  # equal shares (or run eagerly: exact on equal shares only)
            return replicas
        return tf.math.divide_no_nan(tf.cast(total, tf.float32), tf.cast(rows, tf.float32))
    if kind == UNREAD and model not in _said:
        _said.add(model)
        logger.warning(
            "kdist: a loss given to add_loss in %s's step depends on the batch in a way kdist "
            "cannot read (%s): it is divided by the %d replicas, which is one device's for a "
            "mean over the batch, not for a sum; write the penalty as ops.mean(...) or "
            "ops.sum(...) over the rows (times a constant), which kdist reads",
            type(model).__name__, why, replicas)
    return 1


def over_the_batch(loss) -> tuple[str, str]:
    """(INDEPENDENT, SUM, MEAN or UNREAD, the op that decided) for a symbolic `loss`."""
    if loss.shape.rank and not same_rows.same_on_every_replica(loss):
        return SUM, loss.op.type  # a value per row: Keras sums it
    return _scalar(loss)


def _scalar(tensor) -> tuple[str, str]:
    import tensorflow as tf

    if same_rows.same_on_every_replica(tensor):
        return INDEPENDENT, ""
    op = tensor.op
    if op.type in ("Sum", "Mean"):
        axes = tf.get_static_value(op.inputs[1])
        rank = op.inputs[0].shape.rank
        if axes is None or rank is None:
            return UNREAD, f"{op.type} over axes not known when traced"
        if 0 in [int(a) % max(rank, 1) for a in list(axes.reshape(-1))] or rank == 0:
            return (SUM if op.type == "Sum" else MEAN), op.type
        return UNREAD, f"{op.type} keeping the rows"
    if op.type in PASSING:
        return _scalar(op.inputs[0])
    if op.type == "Mul":
        moving = [t for t in op.inputs if not same_rows.same_on_every_replica(t)]
        if len(moving) == 1:
            return _scalar(moving[0])
        return UNREAD, "a product of two terms of the batch"
    if op.type in DIVIDING:
        numerator, denominator = op.inputs[0], op.inputs[1]
        kind, why = _scalar(numerator)
        if _is_batch_size(denominator):
            return (MEAN, "a sum divided by the batch size") if kind == SUM else \
                (UNREAD, f"a {kind} divided by the batch size")
        if same_rows.same_on_every_replica(denominator):
            return kind, why
        return UNREAD, "a division by a term of the batch"
    if op.type in ADDING:
        kinds = {_scalar(t) for t in op.inputs}
        moving = {kind for kind in kinds if kind[0] != INDEPENDENT}
        if len({kind for kind, _ in moving}) == 1:
            kind, why = next(iter(moving))
            if kind == MEAN or len(moving) == len(kinds):
                return kind, why  # a term added to a mean is divided as one device's would be
        return UNREAD, f"{op.type} of terms that differ"
    return UNREAD, f"{op.type} above the batch's reduction"


def _is_batch_size(tensor) -> bool:
    """The replica's batch size: `ops.shape(h)[0]` of a tensor of the batch, cast or not, or a
    constant equal to the replica's static batch."""
    import tensorflow as tf

    while tensor.op.type in PASSING:
        tensor = tensor.op.inputs[0]
    static = tf.get_static_value(tensor)
    if static is not None:
        rows = weights.recorded_batch_size()
        rows = tf.get_static_value(rows) if rows is not None else None
        return rows is not None and static.size == 1 and float(static) == float(rows)
    op = tensor.op
    if op.type != "StridedSlice" or op.inputs[0].op.type != "Shape":
        return False
    begin = tf.get_static_value(op.inputs[1])
    return begin is not None and list(begin.reshape(-1))[:1] == [0] and \
        not same_rows.same_on_every_replica(op.inputs[0].op.inputs[0])
