"""What kdist adds to Keras's `fit`, `evaluate` and `predict`, decided in one place per call.

It acts only on models kdist is responsible for, in this order:

1. the cluster, from the model's strategy (`kdist.strategies.cluster_of`): the spec kdist built the
   strategy for, or a hand-built multi-worker / parameter-server strategy's own resolver; never
   TF_CONFIG, so a plain Keras model in the same process is untouched whatever TF_CONFIG holds;
2. progress: with ``verbose="auto"`` (Keras's default) only the chief prints, as tf-keras did;
   an explicit ``verbose=1/2`` is honoured everywhere;
3. the gradient exchange: a model whose exchange has phases (compression, accumulation) gets
   `kdist.exchange.phases.PhaseCallback` in `fit`; a model on several synchronous replicas gets
   `kdist.replicas.ReplicaCheck` (unless ``check_replicas="off"``); one compiled inside ``kdist.scope(balance=...)``
   gets its training batches split in proportion (`kdist.balance.fitting`);
4. refusals with the reason instead of a failure deep inside the first step: `jit_compile=True`
   with several replicas on CPU devices (TensorFlow cannot compile the all-reduce there), and
   `steps_per_execution > 1` with several replicas on Keras <= 3.6;
5. parameter-server training: under ParameterServerStrategy the call runs kdist's ClusterCoordinator
   loop (`kdist.ps.training`; Keras 3 has none: keras-team/keras#18624); otherwise Keras's own.
"""

from __future__ import annotations

import logging

from kdist import model_state as states
from kdist import replicas, steps, verify_plan
from kdist.balance import fitting
from kdist.exchange import host_rows
from kdist.exchange.phases import PhaseCallback
from kdist.keras_seam import hook_points, keras_internals, versions
from kdist.ps import training as ps_training
from kdist.steps import reading
from kdist.strategies import cluster_of, is_multi_worker, is_parameter_server, registry
from kdist.wiring import agreement, batch_statistics, verify

logger = logging.getLogger("kdist")

FIT_INPUT = ("x", "y", "sample_weight", "batch_size")  # ModelState.fit_input during a fit


def dispatch(name: str, original, arguments):
    """Runs `model.<name>(...)` (`arguments`: Keras's method's bound arguments)."""
    from kdist.wiring.options import TrainingOptions

    model = arguments.arguments["self"]
    strategy = keras_internals.strategy_of(model)  # None: built outside any strategy scope
    spec = cluster_of(strategy)
    if spec is not None and arguments.arguments.get("verbose", "auto") == "auto" \
            and not spec.is_chief:
        arguments.arguments["verbose"] = 0
    state = states.of(model)
    if name == "fit":
        agreement.refuse_model_outside(model, strategy, registry.current_built())
        if strategy is not None and model.jit_compile is True:
            _check_xla(strategy)
        if strategy is not None and model.steps_per_execution > 1:
            _check_steps_per_execution(strategy, model.steps_per_execution)
        if strategy is not None and strategy.num_replicas_in_sync > 1:
            _warn_custom_step_unscaled(model, strategy.num_replicas_in_sync)
            if not is_parameter_server(strategy):
                batch_statistics.say_once(model, strategy.num_replicas_in_sync)
        state.fit_input = tuple(arguments.arguments.get(k) for k in FIT_INPUT)
        hook_points.adopt_stock_backups(arguments.arguments.get("callbacks"))
        added = []
        exchange = states.exchange_of(model)
        if exchange is not None and exchange.has_phases:
            added.append(PhaseCallback(exchange))
        options = state.options or TrainingOptions()
        if is_multi_worker(strategy):
            agreement.check(model, spec, _workers(spec), arguments.arguments, options,
                            timeout=registry.options_of(strategy).dead_peer_timeout)
        if strategy is not None and options.check_replicas != "off" and \
                replicas.compares(strategy):
            added.append(replicas.ReplicaCheck(options.check_replicas))
        if options.watch_steps and is_multi_worker(strategy):
            added.append(_step_watch(model, spec, options))
        plan = verify_plan.Plan.of_environment()
        if plan is not None:
            added = verify.prepare(plan, model, strategy, spec, arguments.arguments,
                                   options) + added
        if added:
            arguments.arguments["callbacks"] = [*added, *(arguments.arguments.get("callbacks")
                                                          or [])]
    try:
        if strategy is not None and is_parameter_server(strategy):
            return getattr(ps_training, name)(*arguments.args, **arguments.kwargs)
        if name == "fit":
            with fitting.fitting(model):
                history = original(*arguments.args, **arguments.kwargs)
            if plan is not None:
                verify.finish(plan, spec)
            return history
        return original(*arguments.args, **arguments.kwargs)
    finally:
        if name == "fit":
            state.fit_input = None  # no reference to the user's arrays after fit


def _workers(spec) -> list[str]:
    return [f"{t}:{i}" for t, i in spec.tasks() if t in ("chief", "worker")]


def _check_xla(strategy) -> None:
    """XLA cannot compile the collectives of a multi-replica step on CPU devices (TF 2.21:
    "Collectives are not yet implemented for CPU devices when compiling with XLA", b/194942685),
    so `jit_compile=True` would fail deep in the first step: say so before it starts."""
    devices = strategy.extended.worker_devices
    if strategy.num_replicas_in_sync > 1 and all("CPU" in d.upper() for d in devices):
        raise ValueError(
            f"compile(jit_compile=True) with {strategy.num_replicas_in_sync} replicas on CPU "
            "devices: TensorFlow's XLA cannot compile the gradient all-reduce on CPU "
            "(b/194942685). Use jit_compile=False, or 'auto' (Keras then leaves XLA off on CPU)")


def _step_watch(model, spec, options):
    """`kdist.steps.StepWatch` for this fit; the step reads its clock where the batch arrives
    (not under XLA, which compiles no Python call)."""
    if model.jit_compile is not True:
        keras_internals.wrap_train_step(model, _input_read)
    steps.clock.stamps()  # created here, at the same point on every worker
    return steps.StepWatch(spec.task, _workers(spec), options.hang_timeout, options.hang_action,
                           multi_worker=True, per_worker=host_rows.per_worker)


def _input_read(train_step):
    """`train_step`, with the step clock read once its batch has arrived."""
    import functools

    @functools.wraps(train_step)
    def step(data):
        reading(data, "input")
        return train_step(data)

    return step


def _warn_custom_step_unscaled(model, replicas: int) -> None:
    """Keras < 3.8 does not divide a loss by the replicas in sync (keras-team/keras#19891):
    kdist scales it where the stock train_step computes gradients, but a train_step of the
    user's own sums N unscaled gradients. Said once per model, with the fix."""
    import keras

    state = states.of(model)
    if versions.version(keras.__version__) >= (3, 8, 0) or state.warned_unscaled_step or \
            type(model).train_step is keras.Model.train_step:
        return
    state.warned_unscaled_step = True
    logger.warning(
        "kdist: %s overrides train_step and trains on %d replicas with Keras %s, which does not "
        "divide the loss by the replicas (fixed in Keras 3.8): unless your train_step divides "
        "the loss it differentiates by tf.distribute.get_strategy().num_replicas_in_sync, the "
        "summed gradient is %d times one device's. Or use Keras >= 3.8",
        type(model).__name__, replicas, keras.__version__, replicas)


def _check_steps_per_execution(strategy, steps_per_execution: int) -> None:
    import keras

    safe = versions.for_running_keras(keras_internals.STEPS_PER_EXECUTION_SAFE_WITH_REPLICAS)
    if strategy.num_replicas_in_sync > 1 and not safe:
        raise ValueError(
            f"compile(steps_per_execution={steps_per_execution}) with "
            f"{strategy.num_replicas_in_sync} replicas on Keras {keras.__version__}: Keras <= 3.6 "
            "aborts the gradient all-reduce when an epoch ends inside an execution. Use "
            "steps_per_execution=1, or Keras >= 3.7")
