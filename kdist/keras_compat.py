"""Every patch kdist applies to Keras 3, in one place.

Each `Workaround` names the upstream report, the Keras and TensorFlow versions it was written for and
checked against, and installs only when the running versions fall in that range (outside it kdist
logs that the patch was skipped, so a Keras upgrade that fixes the bug upstream is noticed, and one
that does not is caught by the regression tests in `tests/test_multi_worker.py`).

`install()` is idempotent and is called by `kdist.scope()`; `uninstall()` restores Keras exactly (the
regression tests use it to show each bug still exists upstream).

>>> from kdist import keras_compat
>>> active = keras_compat.install()          # what kdist.scope() does
>>> "scalar_metric_reduce" in active
True
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import zlib
from typing import Callable

logger = logging.getLogger("kdist")


def _version(text: str) -> tuple[int, int, int]:
    parts = (text.split("+")[0].split(".") + ["0", "0"])[:3]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


@dataclasses.dataclass
class Workaround:
    """One patch: what it fixes, where it was reported, which versions it targets."""

    name: str
    upstream: str
    keras_versions: tuple[str, str]  # inclusive range of Keras versions the patch is written for
    tf_versions: tuple[str, str]  # inclusive range of TensorFlow versions it was checked with
    patch: Callable[[], list[tuple[object, str, object]]]  # installs, returns (owner, attr, original)
    active: bool = False
    _originals: list = dataclasses.field(default_factory=list, repr=False)

    def applies(self, keras_version: str, tf_version: str) -> bool:
        low, high = (_version(v) for v in self.keras_versions)
        tf_low, tf_high = (_version(v) for v in self.tf_versions)
        return low <= _version(keras_version) <= high and tf_low <= _version(tf_version) <= tf_high

    def install(self) -> None:
        if not self.active:
            self._originals = self.patch()
            self.active = True

    def uninstall(self) -> None:
        for owner, attr, original in reversed(self._originals):
            if original is _INHERITED:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        self._originals, self.active = [], False


_INHERITED = object()  # marks an attribute that `owner` only inherited: uninstall deletes it


def _replace(owner, attr: str, make: Callable) -> tuple[object, str, object]:
    original = getattr(owner, attr)
    inherited = attr not in vars(owner)
    setattr(owner, attr, make(original))
    return owner, attr, _INHERITED if inherited else original


def _is_multi_worker(strategy) -> bool:
    import tensorflow as tf

    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())


# ----------------------------------------------------------------------------------------------
# 1. `_maybe_symbolic_build` all-reduces the first batch just to learn its shapes. Under MWMS the
#    cross-worker `strategy.reduce(MEAN, <nested PerReplica>, axis=None)` cannot convert the
#    PerReplica structure and raises "Attempt to convert a value (PerReplica...) with an unsupported
#    type" (flat inputs and dict inputs alike: keras-team/keras#20585, keras-team/keras#20329,
#    tensorflow/tensorflow#72388). Shapes need no collective: take the first local replica's batch.
def _patch_symbolic_build():
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    def make(original):
        @functools.wraps(original)
        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            if self._distribute_strategy is None or iterator is None:
                return original(self, iterator=iterator, data_batch=data_batch)
            strategy = self.distribute_strategy
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tree.map_structure(
                    lambda v: (strategy.experimental_local_results(v)[0]
                               if isinstance(v, tf.distribute.DistributedValues) else v), batch)
                break
            return original(self, iterator=None, data_batch=data_batch)

        return _maybe_symbolic_build

    return [_replace(trainer.TensorFlowTrainer, "_maybe_symbolic_build", make)]


# ----------------------------------------------------------------------------------------------
# 2. `reduce_per_replica(..., "mean")` reduces every step's logs with `strategy.reduce("MEAN", v,
#    axis=0)` under multi-worker collectives; the logs are scalars, so TF raises "Invalid reduction
#    dimension 0 for input with 0 dimensions" (keras-team/keras#20585). Scalars are all-reduced
#    with axis=None; tensors keep Keras's behaviour.
def _patch_scalar_reduce():
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    def make(original):
        @functools.wraps(original)
        def reduce_per_replica(values, strategy, reduction):
            if reduction not in ("auto", "mean") or not _is_multi_worker(strategy):
                return original(values, strategy, reduction)

            def reduce(v):
                axis = None if v.shape.rank == 0 else 0
                return strategy.reduce("MEAN", v, axis=axis)

            return tree.map_structure(reduce, values)

        return reduce_per_replica

    return [_replace(trainer, "reduce_per_replica", make)]


# ----------------------------------------------------------------------------------------------
# 3. In-memory arrays (`fit(x=np_array, shuffle=True)`): Keras's ArrayDataAdapter permutes the
#    indices with an unseeded `tf.random.shuffle` in every process, then tf.data auto-shards the
#    batches by DATA. Each worker takes its slice of a *different* permutation, so within an epoch
#    some examples are trained on twice and others never. No upstream report found; tf-keras avoided
#    it by not shuffling per worker. kdist shuffles with one seed shared by every worker of the job
#    (derived from the cluster's addresses) and reshuffles each epoch, so the shards partition it.
def _shared_shuffle_seed() -> int:
    from kdist.cluster import cluster

    return zlib.crc32(json.dumps(cluster().jobs, sort_keys=True).encode())


def _consistently_shuffled_dataset(adapter, seed: int):
    import numpy as np
    import tensorflow as tf
    from keras.src import tree
    from keras.src.trainers.data_adapters import array_slicing

    inputs = tree.lists_to_tuples(
        array_slicing.convert_to_sliceable(adapter._inputs, target_backend="tensorflow"))
    if not all(isinstance(t, np.ndarray) or (tf.is_tensor(t) and not isinstance(
            t, (tf.SparseTensor, tf.RaggedTensor))) for t in tree.flatten(inputs)):
        raise ValueError("fit(shuffle=True) on in-memory sparse or ragged inputs under "
                         "MultiWorkerMirroredStrategy cannot be shuffled identically on every "
                         "worker; pass a tf.data.Dataset (shuffled with a fixed seed) or "
                         "shuffle=False")
    indices = tf.data.Dataset.range(adapter._num_samples)
    if adapter._shuffle == "batch":
        indices = indices.batch(adapter._batch_size).shuffle(
            adapter.num_batches, seed=seed, reshuffle_each_iteration=True)
    else:
        indices = indices.shuffle(adapter._num_samples, seed=seed,
                                  reshuffle_each_iteration=True).batch(adapter._batch_size)
    dataset = indices.map(lambda i: tree.map_structure(lambda t: tf.gather(t, i), inputs),
                          num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def _patch_array_shuffle():
    from keras.src.backend.tensorflow import trainer
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    def make(original):
        @functools.wraps(original)
        def __init__(self, distribute_strategy=None, *args, **kwargs):
            original(self, distribute_strategy, *args, **kwargs)
            adapter = self.data_adapter
            if (isinstance(adapter, ArrayDataAdapter) and adapter._shuffle
                    and _is_multi_worker(distribute_strategy)):
                self._distributed_dataset = distribute_strategy.experimental_distribute_dataset(
                    _consistently_shuffled_dataset(adapter, _shared_shuffle_seed()))

        return __init__

    return [_replace(trainer.TFEpochIterator, "__init__", make)]


# ----------------------------------------------------------------------------------------------
# 4. kdist behaviour, not a bug: Keras 3 prints a progress bar in every worker process, so N workers
#    interleave N bars. With verbose="auto" (the default) only the chief prints; an explicit
#    verbose=1/2 is honoured everywhere. tf-keras had the same rule.
def _patch_progress_bar():
    from keras.src.backend.tensorflow import trainer

    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def method(*args, **kwargs):
            from kdist.cluster import cluster

            bound = signature.bind(*args, **kwargs)
            if bound.arguments.get("verbose", "auto") == "auto" and not cluster().is_chief:
                bound.arguments["verbose"] = 0
            return original(*bound.args, **bound.kwargs)

        return method

    return [_replace(trainer.TensorFlowTrainer, name, make)
            for name in ("fit", "evaluate", "predict")]


# ----------------------------------------------------------------------------------------------
# 5. Keras 3 has no ParameterServerStrategy path in fit/evaluate/predict (keras-team/keras#18624):
#    "To use this dataset, you need to pass this dataset to ClusterCoordinator...". Under PSS the
#    three methods run kdist's ClusterCoordinator integration (kdist/keras_ps.py).
def _patch_parameter_server_training():
    from keras.src.backend.tensorflow import trainer

    from kdist import keras_ps

    def make(name):
        def wrap(original):
            @functools.wraps(original)
            def method(self, *args, **kwargs):
                if keras_ps.is_parameter_server(self.distribute_strategy):
                    return getattr(keras_ps, name)(self, *args, **kwargs)
                return original(self, *args, **kwargs)

            return method

        return wrap

    return [_replace(trainer.TensorFlowTrainer, name, make(name))
            for name in ("fit", "evaluate", "predict")]


# ----------------------------------------------------------------------------------------------
# 6. Keras 3's `Variable.assign_add/assign_sub` is `assign(self + value)`: a read-modify-write.
#    Under ParameterServerStrategy the workers update the same ps variables concurrently, so
#    increments are lost: metrics come out wrong (accuracy 1.12 measured) and
#    `optimizer.iterations` undercounts. No upstream report found. Under PSS, kdist uses the
#    variable's own assign_add/assign_sub, which the ps applies atomically.
def _patch_atomic_assign():
    import tensorflow as tf
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.tensorflow import core

    def make(name):
        def wrap(original):
            @functools.wraps(original)
            def method(self, value):
                from kdist.keras_ps import is_parameter_server

                if (self._value is None or in_stateless_scope()
                        or not is_parameter_server(tf.distribute.get_strategy())):
                    return original(self, value)
                value = self._convert_to_tensor(value, dtype=self.dtype)
                return getattr(self._value, name)(value)

            return method

        return wrap

    return [_replace(core.Variable, name, make(name)) for name in ("assign_add", "assign_sub")]


# ----------------------------------------------------------------------------------------------
# 7. kdist feature, not a bug: gradient compression (kdist/compression). compile() inside
#    kdist.scope(compression=...) binds the compressor to the optimizer; the optimizer creates the
#    compressor's per-replica state when it builds and compresses where Keras all-reduces
#    (`_all_reduce_sum_gradients`); aggregate_every accumulates locally in `_backend_update_step`
#    (Keras's own gradient_accumulation_steps puts the all-reduce inside ops.cond, which
#    MirroredStrategy and MultiWorkerMirroredStrategy reject: "merge_call called while defining a
#    new graph", Keras 3.15 / TF 2.21); fit() gets the callback that picks each step's phase.
def _patch_gradient_compression():
    from keras.src.backend.tensorflow import optimizer as tf_optimizer
    from keras.src.backend.tensorflow import trainer
    from keras.src.trainers import trainer as base_trainer

    from kdist.compression import hook

    def all_reduce(original):
        @functools.wraps(original)
        def _all_reduce_sum_gradients(self, grads_and_vars):
            import tensorflow as tf

            context = tf.distribute.get_replica_context()
            if getattr(self, "_kdist_compression", None) is None or context is None:
                return original(self, grads_and_vars)
            return hook.all_reduce_sum(self, grads_and_vars, context)

        return _all_reduce_sum_gradients

    def update_step(original):
        @functools.wraps(original)
        def _backend_update_step(self, grads, variables, learning_rate):
            return hook.update_step(self, grads, variables, learning_rate, original)

        return _backend_update_step

    def weight_decay(original):
        @functools.wraps(original)
        def _apply_weight_decay(self, variables):
            if not hook.accumulating(self):  # decay once per applied update, not per micro-step
                return original(self, variables)

        return _apply_weight_decay

    def build(original):
        @functools.wraps(original)
        def method(self, variables):
            original(self, variables)
            hook.create_state(self, variables)

        return method

    def compile(original):
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            original(self, *args, **kwargs)
            hook.bind_active(self)

        return method

    def fit(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def method(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            model = bound.arguments["self"]
            if hook.is_bound(model):
                callbacks = bound.arguments.get("callbacks") or []
                bound.arguments["callbacks"] = [hook.PhaseCallback(model.optimizer), *callbacks]
            return original(*bound.args, **bound.kwargs)

        return method

    return [_replace(tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients", all_reduce),
            _replace(tf_optimizer.TFOptimizer, "_backend_update_step", update_step),
            _replace(tf_optimizer.TFOptimizer, "_apply_weight_decay", weight_decay),
            _replace(tf_optimizer.TFOptimizer, "build", build),
            # On Trainer itself: Keras treats a compile() that differs from Trainer.compile as
            # custom and then skips compiling models it loads.
            _replace(base_trainer.Trainer, "compile", compile),
            _replace(trainer.TensorFlowTrainer, "fit", fit)]


WORKAROUNDS = [
    Workaround("symbolic_build_without_collective",
               "keras-team/keras#20585, keras-team/keras#20329, tensorflow/tensorflow#72388",
               ("3.0.0", "3.15.99"), ("2.16.0", "2.21.99"), _patch_symbolic_build),
    Workaround("scalar_metric_reduce", "keras-team/keras#20585",
               ("3.0.0", "3.15.99"), ("2.16.0", "2.21.99"), _patch_scalar_reduce),
    Workaround("consistent_array_shuffle", "none filed; described above (kdist)",
               ("3.0.0", "3.15.99"), ("2.16.0", "2.21.99"), _patch_array_shuffle),
    Workaround("parameter_server_training", "keras-team/keras#18624",
               ("3.0.0", "3.15.99"), ("2.16.0", "2.21.99"), _patch_parameter_server_training),
    Workaround("atomic_assign_under_parameter_server", "none filed; described above (kdist)",
               ("3.0.0", "3.15.99"), ("2.16.0", "2.21.99"), _patch_atomic_assign),
    Workaround("gradient_compression", "kdist feature (no TF/Keras gradient compression)",
               ("3.0.0", "3.15.99"), ("2.16.0", "2.21.99"), _patch_gradient_compression),
    # Installed last, so it wraps every other patch of fit/evaluate/predict.
    Workaround("progress_bar_on_chief_only", "kdist behaviour (tf-keras printed on the chief only)",
               ("3.0.0", "3.15.99"), ("2.16.0", "2.21.99"), _patch_progress_bar),
]


def install() -> list[str]:
    """Installs every workaround that targets the running Keras/TF; returns the active names."""
    import keras
    import tensorflow as tf

    for workaround in WORKAROUNDS:
        if workaround.active:
            continue
        if workaround.applies(keras.__version__, tf.__version__):
            workaround.install()
        else:
            logger.warning("kdist: workaround %s (%s) targets Keras %s..%s / TF %s..%s, not Keras %s "
                           "/ TF %s: skipped. Run kdist's test suite to check this version.",
                           workaround.name, workaround.upstream, *workaround.keras_versions,
                           *workaround.tf_versions, keras.__version__, tf.__version__)
    return [w.name for w in WORKAROUNDS if w.active]


def uninstall() -> None:
    """Restores Keras exactly as it was before `install()`."""
    for workaround in reversed(WORKAROUNDS):
        workaround.uninstall()
