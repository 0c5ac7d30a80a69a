"""The one wrapper kdist puts around Keras's `fit`, `evaluate` and `predict`.

It acts only on models kdist is responsible for, and decides in one place, in this order:

1. the cluster, from the model's strategy (`kdist.strategies.cluster_of`): the spec kdist built the
   strategy for, or a hand-built multi-worker / parameter-server strategy's own resolver; never
   TF_CONFIG, so a plain Keras model in the same process is untouched whatever TF_CONFIG holds;
2. progress: with ``verbose="auto"`` (Keras's default) only the chief prints, as tf-keras did;
   an explicit ``verbose=1/2`` is honoured everywhere;
3. compression: a model compiled inside ``kdist.scope(compression=...)`` gets the phase callback
   (`kdist.compression.keras_hook.PhaseCallback`) in `fit`; one compiled inside
   ``kdist.scope(balance=...)`` gets its training batches split in proportion
   (`kdist.balance.fitting`, after Keras builds the model from the first batch);
4. XLA: `jit_compile=True` with several replicas on CPU devices is refused with the reason
   (TensorFlow cannot compile the all-reduce there) instead of failing inside the first step;
   so is `steps_per_execution > 1` with several replicas on Keras <= 3.6 (its unrolled steps abort
   the all-reduce at the end of an epoch; `kdist.keras_compat.internals`);
5. parameter-server training: under ParameterServerStrategy the call runs kdist's ClusterCoordinator
   loop (`kdist.ps.training`; Keras 3 has none: keras-team/keras#18624); otherwise Keras's own.

>>> from kdist import fit_dispatch
>>> fit_dispatch.install()
>>> from keras.src.backend.tensorflow import trainer
>>> "kdist" in trainer.TensorFlowTrainer.fit.__code__.co_filename
True
"""

from __future__ import annotations

import functools
import inspect

from kdist.keras_compat import registry

METHODS = ("fit", "evaluate", "predict")
FIT_INPUT = ("x", "y", "sample_weight", "batch_size")  # model._kdist_fit_input during a fit
_installed: list = []


def _dispatching(name: str, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(*args, **kwargs):
        from kdist.balance import fitting
        from kdist.compression import keras_hook
        from kdist.strategies import cluster_of, is_parameter_server

        bound = signature.bind(*args, **kwargs)
        model = bound.arguments["self"]
        strategy = model._distribute_strategy  # None: built outside any strategy scope
        spec = cluster_of(strategy)
        if spec is not None and bound.arguments.get("verbose", "auto") == "auto" \
                and not spec.is_chief:
            bound.arguments["verbose"] = 0
        if name == "fit" and strategy is not None and model.jit_compile is True:
            _check_xla(strategy)
        if name == "fit" and strategy is not None and model.steps_per_execution > 1:
            _check_steps_per_execution(strategy, model.steps_per_execution)
        if name == "fit":  # BackupAndRestore reads it to keep its position in examples
            model._kdist_fit_input = tuple(bound.arguments.get(k) for k in FIT_INPUT)
        bound_optimizer = keras_hook.binding(model)
        if name == "fit" and bound_optimizer is not None and bound_optimizer.has_phases:
            callbacks = bound.arguments.get("callbacks") or []
            bound.arguments["callbacks"] = [keras_hook.PhaseCallback(model.optimizer), *callbacks]
        try:
            if strategy is not None and is_parameter_server(strategy):
                from kdist.ps import training

                return getattr(training, name)(*bound.args, **bound.kwargs)
            if name == "fit":
                with fitting.fitting(model):
                    return original(*bound.args, **bound.kwargs)
            return original(*bound.args, **bound.kwargs)
        finally:
            if name == "fit":
                model._kdist_fit_input = None  # no reference to the user's arrays after fit

    return method


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


def _check_steps_per_execution(strategy, steps_per_execution: int) -> None:
    import keras

    from kdist.keras_compat import internals

    safe = internals.for_running_keras(internals.STEPS_PER_EXECUTION_SAFE_WITH_REPLICAS)
    if strategy.num_replicas_in_sync > 1 and not safe:
        raise ValueError(
            f"compile(steps_per_execution={steps_per_execution}) with "
            f"{strategy.num_replicas_in_sync} replicas on Keras {keras.__version__}: Keras <= 3.6 "
            "aborts the gradient all-reduce when an epoch ends inside an execution. Use "
            "steps_per_execution=1, or Keras >= 3.7")


def install() -> None:
    """Wraps `fit`, `evaluate` and `predict` once; installs the compression optimizer patches and
    kdist's `BackupAndRestore` behind the stock class."""
    if _installed:
        return
    from keras.src.backend.tensorflow import trainer

    from kdist import callbacks
    from kdist.compression import keras_hook

    keras_hook.install()
    callbacks.install()
    _installed.extend(registry.replace(trainer.TensorFlowTrainer, name,
                                       functools.partial(_dispatching, name))
                      for name in METHODS)
    _installed.append(registry.replace(trainer.TensorFlowTrainer, "_maybe_symbolic_build",
                                       _balancing_after_build))


def _balancing_after_build(original):
    """Keras's `_maybe_symbolic_build`, then `kdist.balance`'s re-split of fit's training input."""

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        from kdist.balance import fitting

        original(self, iterator=iterator, data_batch=data_batch)
        if iterator is not None:
            fitting.after_symbolic_build(self, iterator)

    return _maybe_symbolic_build


def uninstall() -> None:
    """Restores Keras's own methods (and optimizer)."""
    from kdist import callbacks
    from kdist.compression import keras_hook

    registry.undo(_installed)
    _installed.clear()
    keras_hook.uninstall()
    callbacks.uninstall()
