"""The hook patches: each replaces one Keras method by one that asks the connected `Hooks`.

The replacements call Keras's own method unless kdist's hooks act on the object (a model compiled
inside `kdist.scope(...)`, a strategy kdist built); see `kdist.keras_seam.hooks` for what each
point means and `kdist.wiring.KdistHooks` for what kdist does there.
"""

from __future__ import annotations

import functools
import inspect

from kdist.keras_seam.hooks import connected
from kdist.keras_seam.registry import HOOK, Patch, Target


def _dispatch(name: str):
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def method(*args, **kwargs):
            return connected().dispatch(name, original, signature.bind(*args, **kwargs))

        return method

    return make


def _after_compile(original):
    @functools.wraps(original)
    def compile(self, *args, **kwargs):
        original(self, *args, **kwargs)
        connected().after_compile(self)

    return compile


def _after_symbolic_build(original):
    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        original(self, iterator=iterator, data_batch=data_batch)
        if iterator is not None:
            connected().after_symbolic_build(self, iterator)

    return _maybe_symbolic_build


def _after_build(original):
    @functools.wraps(original)
    def build(self, variables):
        original(self, variables)
        connected().optimizer_built(self, variables)

    return build


def _apply_gradients(original):
    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, **kwargs):
        return connected().apply_gradients(self, grads_and_vars, original, kwargs)

    return apply_gradients


def _exchange(original):
    @functools.wraps(original)
    def _all_reduce_sum_gradients(self, grads_and_vars):
        return connected().exchange_gradients(self, grads_and_vars, original)

    return _all_reduce_sum_gradients


def _metric_results(original):
    @functools.wraps(original)
    def get_metrics_result(self):
        import tensorflow as tf

        if not tf.executing_eagerly() or (tf.distribute.has_strategy()
                                          and tf.distribute.get_replica_context() is not None):
            return original(self)  # inside a replica's step: its own copies, as Keras reads them
        return connected().metric_results(self, original)

    return get_metrics_result


def _update_step(original):
    @functools.wraps(original)
    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        return connected().update_step(self, grads, trainable_variables, learning_rate, original)

    return _backend_update_step


def _weight_decay(original):
    @functools.wraps(original)
    def _apply_weight_decay(self, variables):
        return connected().apply_weight_decay(self, variables, original)

    return _apply_weight_decay


def _slot_device(original):
    @functools.wraps(original)
    def add_variable_from_reference(self, reference_variable, *args, **kwargs):
        import tensorflow as tf

        device = connected().slot_device(self, reference_variable)
        if device is None:
            return original(self, reference_variable, *args, **kwargs)
        with tf.device(device):
            return original(self, reference_variable, *args, **kwargs)

    return add_variable_from_reference


def _backup_class(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        replacement = connected().backup_class()
        if replacement is not None and type(self) is _stock_backup_class():
            self.__class__ = replacement  # a subclass: isinstance checks still hold
            return replacement.__init__(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    return __init__


def _stock_backup_class():
    import keras

    return keras.callbacks.BackupAndRestore


def adopt_stock_backups(callbacks) -> None:
    """Makes kdist's each stock `keras.callbacks.BackupAndRestore` in `callbacks` that was built
    before the hook above was installed (after `import kdist`, before the first `kdist.scope()`),
    with the same settings, as if it had been built with the hook (nothing was saved yet)."""
    replacement = connected().backup_class()
    if replacement is None or not _patch("backup_and_restore_is_kdists").active:
        return
    for callback in callbacks or ():
        if type(callback) is _stock_backup_class():
            settings = {"backup_dir": callback.backup_dir, "save_freq": callback.save_freq,
                        "delete_checkpoint": callback.delete_checkpoint,
                        "double_checkpoint": getattr(callback, "double_checkpoint", False)}
            callback.__class__ = replacement
            replacement.__init__(callback, **settings)


def _patch(name: str) -> Patch:
    """`patches.patch(name)` among this module's hooks (the registry imports this module)."""
    return next(patch for patch in HOOKS if patch.name == name)


HOOKS = [
    Patch("dispatch_fit_evaluate_predict", HOOK,
          {Target("Trainer", name): _dispatch(name) for name in ("fit", "evaluate", "predict")},
          why="one place decides, per call, what kdist adds: chief-only progress, refusals with "
              "the reason (XLA on CPU replicas, steps_per_execution on Keras <= 3.6), the phase "
              "callback of compression, the input split of balance, and kdist's own loop under "
              "ParameterServerStrategy (Keras 3 has none: keras-team/keras#18624)"),
    Patch("bind_options_at_compile", HOOK, {Target("BaseTrainer", "compile"): _after_compile},
          why="binds the options of the enclosing kdist.scope(...) (compression, aggregate_every, "
              "bucket_bytes, balance, ps_sync) to the model compiled there; on the base class, "
              "since Keras treats a compile() that differs from its own as custom and then skips "
              "compiling models it loads"),
    Patch("after_symbolic_build", HOOK,
          {Target("Trainer", "_maybe_symbolic_build"): _after_symbolic_build},
          why="balance re-splits fit's training input once Keras has built the model from its "
              "first batch"),
    Patch("optimizer_state", HOOK, {Target("TFOptimizer", "build"): _after_build},
          why="the gradient exchange's per-replica state (compressor residuals, accumulators) is "
              "created with the optimizer's slots and checkpointed with them"),
    Patch("gradient_capture", HOOK, {Target("BaseOptimizer", "apply_gradients"): _apply_gradients},
          why="parameter-server synchronisation (ps_sync) takes a worker's gradient to the ps "
              "instead of applying it, whatever train_step computed it"),
    Patch("gradient_exchange", HOOK,
          {Target("TFOptimizer", "_all_reduce_sum_gradients"): _exchange},
          why="where Keras sums the replicas' gradients in one all-reduce, kdist's exchange "
              "weighs, buckets, compresses and routes them (kdist.exchange)"),
    Patch("metric_results_in_one_sum", HOOK,
          {Target("BaseTrainer", "get_metrics_result"): _metric_results},
          why="kdist reads every metric variable across the workers in one sum over its TCP "
              "ring (kdist.exchange.metric_sums)"),
    Patch("local_accumulation", HOOK,
          {Target("TFOptimizer", "_backend_update_step"): _update_step},
          why="aggregate_every=k accumulates k steps locally and exchanges once (Keras's "
              "gradient_accumulation_steps puts the all-reduce in a cond, which Mirrored "
              "strategies reject)"),
    Patch("weight_decay_per_update", HOOK,
          {Target("TFOptimizer", "_apply_weight_decay"): _weight_decay},
          why="with aggregate_every, weight decay applies once per applied update, not per "
              "accumulated step"),
    Patch("slots_next_to_variables", HOOK,
          {Target("TFOptimizer", "add_variable_from_reference"): _slot_device},
          why="a model-parallel shard's optimizer slots live on the shard's device without a "
              "strategy too (Keras builds the optimizer while tracing, where the colocation it "
              "asks for does not reach the eager slot)"),
    Patch("backup_and_restore_is_kdists", HOOK,
          {Target("BackupAndRestore", "__init__"): _backup_class},
          why="keras.callbacks.BackupAndRestore(...) builds kdist's subclass: verified backups, "
              "step-level and elastic resume, checkpoint on SIGTERM"),
]
