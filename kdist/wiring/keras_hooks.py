"""`KdistHooks`: what kdist does at each hook point of the seam (`kdist.keras_seam.hooks`).

`import kdist` connects one instance. Every method leaves objects kdist is not responsible for to
Keras: a model compiled outside `kdist.scope(...)` options, an optimizer with no exchange bound.
"""

from __future__ import annotations

import dataclasses
import logging

from kdist import model_state as states
from kdist.keras_seam import keras_internals, patches, versions
from kdist.keras_seam.hooks import Hooks
from kdist.ps import sync
from kdist.strategies import cluster_of, is_multi_worker, is_parameter_server

# Imported inside functions: the engines (exchange, balance, layers, steps, the fit dispatch),
# which `import kdist` must not load (they import TensorFlow).

logger = logging.getLogger("kdist")


class KdistHooks(Hooks):
    """kdist's features, at the seam's hook points."""

    def dispatch(self, name, original, arguments):
        from kdist.wiring import dispatch

        return dispatch.dispatch(name, original, arguments)

    def after_compile(self, model) -> None:
        """Binds the active `kdist.scope(...)` options to `model`, and the gradient exchange they
        ask for to its optimizer."""
        from kdist.exchange import Exchange, empty_shares, weights
        from kdist.wiring import own_losses, replica_rows
        from kdist.exchange.comm import tcp_ring
        from kdist.wiring import options as training_options

        options = training_options.active()
        if options.balance is not None and model.distribute_strategy.num_replicas_in_sync == 1:
            logger.info("kdist: balance=%s with one replica: nothing to balance", options.balance)
            options = dataclasses.replace(options, balance=None)
        states.bind(model, options)
        if _sums_replicas(model):
            # each replica's gradients weighed by its examples (balance: always); on every
            # replica of several, an empty share computes no loss and no metric
            weighs = _weighs_examples(model) or options.balance is not None
            record = weights.recording_batch_size if weighs else weights.recording_examples
            for step in ("train_step", "test_step"):  # evaluate logs an add_loss sum too
                keras_internals.wrap_method(model, step, record)
                keras_internals.wrap_method(model, step, replica_rows.tracking)
            keras_internals.wrap_method(model, "compute_loss", empty_shares.skipping_loss)
            keras_internals.wrap_method(model, "compute_metrics", empty_shares.skipping_metrics)
            if _own_step_with_divided_losses(model):
                keras_internals.wrap_method(model, "train_step", own_losses.watching)
        optimizer = model.optimizer
        keras_accumulation = _accumulation_in_phases(model)
        if optimizer is None or not (options.exchanges_gradients or keras_accumulation):
            return
        if optimizer.gradient_accumulation_steps and options.exchanges_gradients:
            raise ValueError("kdist.scope(compression/aggregate_every/bucket_bytes/balance) with "
                             "an optimizer's gradient_accumulation_steps: use one way to "
                             "accumulate, aggregate_every=k (kdist) or gradient_accumulation_steps"
                             " (Keras) without the other options")
        if states.exchange_of(optimizer) is not None:
            raise ValueError("this optimizer is already bound by kdist; create a new optimizer "
                             "(or model) per compression setting")
        ring = tcp_ring(model.distribute_strategy)  # the exchange's, decided once: at compile
        states.bind_exchange(optimizer, Exchange(optimizer, options, ring, keras_accumulation))

    def after_symbolic_build(self, model, epoch_iterator) -> None:
        from kdist.balance import fitting

        fitting.after_symbolic_build(model, epoch_iterator)

    def optimizer_built(self, optimizer, variables) -> None:
        exchange = states.exchange_of(optimizer)
        if exchange is not None:
            exchange.create_state(variables)

    def apply_gradients(self, optimizer, grads_and_vars, original, kwargs):
        into = sync.capturing_into(optimizer)
        if into is None:
            return original(optimizer, grads_and_vars, **kwargs)
        into.extend(grads_and_vars)  # the gradient goes to the ps (kdist.ps.sync)
        return None

    def exchange_gradients(self, optimizer, grads_and_vars, original):
        import tensorflow as tf

        from kdist.exchange import plain_sum, same_rows, weights
        from kdist.exchange.comm import tcp_ring
        from kdist.layers import placement
        from kdist.steps import clock
        from kdist.wiring import own_losses
        if sync.applying(optimizer):  # one replica per worker: nothing to exchange
            return list(grads_and_vars)
        context = tf.distribute.get_replica_context()
        if context is None:
            return original(optimizer, grads_and_vars)
        own_losses.check(context.num_replicas_in_sync)
        grads_and_vars = list(grads_and_vars)
        timed = clock.tracing_watched()  # a watched fit is tracing its step (kdist.steps)
        if timed:
            clock.reading([g for g, _ in grads_and_vars], "gradients")
        exchange = states.exchange_of(optimizer)
        if exchange is not None:
            summed = exchange.exchange(grads_and_vars, context)
        elif (ring := tcp_ring(context.strategy)) is not None \
                or weights.weighed_batch_size() is not None \
                or placement.own_group_devices([v for _, v in grads_and_vars], context.strategy) \
                or any(same_rows.sparse_and_same_on_every_replica(g) for g, _ in grads_and_vars):
            summed = plain_sum(grads_and_vars, context, optimizer.iterations, ring)
        else:
            summed = original(optimizer, grads_and_vars)
        if timed:
            clock.reading([g for g, _ in summed], "summed")
        return summed

    def additional_loss_factor(self, model, loss) -> float:
        import tensorflow as tf

        from kdist.wiring import batch_losses

        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        return batch_losses.factor(model, loss, replicas)

    def draw_offset(self, first_dimension):
        from kdist.wiring import replica_rows

        return replica_rows.draw_offset(first_dimension)

    def loss_divided(self) -> None:
        from kdist.wiring import own_losses

        own_losses.loss_divided()

    def mean_of_logs(self, strategy, scalars, one_step_per_call):
        from kdist.exchange import scalar_means

        return scalar_means(strategy, scalars, ring_allowed=one_step_per_call)

    def metric_results(self, model, original) -> dict:
        """Where kdist's TCP ring sums the gradients, every metric variable is read across the
        workers in one sum over the ring (`kdist.exchange.metric_sums`), not in one TensorFlow
        collective each."""
        import keras

        from kdist.exchange import metric_sums
        from kdist.exchange.comm import tcp_ring
        strategy = keras_internals.strategy_of(model)
        ring = tcp_ring(strategy) if strategy is not None else None
        variables = [v for metric in model.metrics for v in metric.variables]
        distributed = [v.value for v in variables]  # TensorFlow's SyncOnRead variables
        if ring is None or not variables or not all(map(metric_sums.summable, distributed)):
            return original(model)
        values = metric_sums.sums_over_ring(ring, distributed, strategy.num_replicas_in_sync)
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return original(model)

    def update_step(self, optimizer, grads, variables, learning_rate, original):
        exchange = states.exchange_of(optimizer)
        if exchange is None:
            return original(optimizer, grads, variables, learning_rate)
        return exchange.update_step(grads, variables, learning_rate, original)

    def apply_weight_decay(self, optimizer, variables, original):
        exchange = states.exchange_of(optimizer)
        if exchange is None:
            return original(optimizer, variables)
        return exchange.apply_weight_decay(variables, original)

    def accumulation_phase(self, optimizer):
        exchange = states.exchange_of(optimizer)
        if exchange is None or not exchange.keras_accumulation:
            return None
        return exchange.phase.accumulate

    def slot_device(self, optimizer, reference_variable):
        from kdist.layers import placement

        return placement.slot_device(reference_variable)

    def cluster_of(self, strategy):
        return cluster_of(strategy)

    def backup_class(self):
        from kdist.callbacks import BackupAndRestore

        return BackupAndRestore


def _sums_replicas(model) -> bool:
    strategy = model.distribute_strategy
    return strategy.num_replicas_in_sync > 1 and not is_parameter_server(strategy)


def _own_step_with_divided_losses(model) -> bool:
    """Whether `model` has a `train_step` of the user's and Keras divides losses by the replicas
    (through kdist's fix `loss_value_per_replica`, Keras >= 3.8), so `kdist.wiring.own_losses`
    can tell a step whose loss it never divided."""
    import keras

    return type(model).train_step is not keras.Model.train_step and \
        patches.patch("loss_value_per_replica").active


def _weighs_examples(model) -> bool:
    """Whether `model` trains on several synchronous replicas whose gradients kdist weighs by
    their examples (`kdist.exchange.weights`). Not under Mirrored on Keras < 3.8 (the TF 2.17
    tier): there the replicas of a clipped or sample-weighted fit drift apart by about 1e-10
    when weighed (measured, not understood), so Keras's equal weights stay."""
    import keras

    if not _sums_replicas(model):
        return False
    return is_multi_worker(model.distribute_strategy) or \
        versions.version(keras.__version__) >= (3, 8, 0)


def _accumulation_in_phases(model) -> int | None:
    """Keras's `gradient_accumulation_steps` when `model` trains on several synchronous replicas,
    where kdist runs it in phases (`kdist.keras_seam.one_device_fixes`); None otherwise."""
    optimizer, strategy = model.optimizer, model.distribute_strategy
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if not steps or strategy.num_replicas_in_sync == 1 or is_parameter_server(strategy):
        return None
    return steps

