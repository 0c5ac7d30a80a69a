"""The Keras classes kdist patches, found by what exists in the running Keras, never by a name
that a release may change.

Keras 3.16 renamed `TensorFlowTrainer` to `Trainer` (and the base `Trainer` to `BaseTrainer`), so
the trainer is found in `keras.Model`'s own class hierarchy, by the module that defines it (in
keras, or in a `keras_tensorflow` backend package: `BACKEND_PACKAGES`); the optimizer likewise in
`keras.optimizers.Optimizer`'s. Public classes are taken from the public API.

>>> resolve("Trainer").__module__
'keras.src.backend.tensorflow.trainer'
>>> isinstance(__import__("keras").metrics.Mean().variables[0], resolve("Variable"))
True
"""

from __future__ import annotations

import importlib
import sys


class SeamError(RuntimeError):
    """The running Keras has no class or attribute where kdist's seam expects one."""


# Where Keras's TensorFlow backend lives: inside keras today; in a package of its own once Keras's
# pluggable backends land (keras-team/keras#23523: `keras_openvino` is its example, so
# `keras_tensorflow`), where the seam looks for the same module names.
BACKEND_PACKAGES = ("keras.src.backend.tensorflow", "keras_tensorflow")


def _tf_backend(name: str) -> tuple[str, ...]:
    """'trainer' -> the module names the TensorFlow backend's `trainer` may have."""
    return tuple(f"{package}.{name}" for package in BACKEND_PACKAGES)


def _in_hierarchy(cls, *modules: str):
    for klass in cls.__mro__:
        if klass.__module__ in modules:
            return klass
    module = " or ".join(modules)
    raise SeamError(f"kdist cannot find the class of {module} in {cls.__name__}'s hierarchy "
                    f"({', '.join(k.__module__ + '.' + k.__name__ for k in cls.__mro__)}); this "
                    "Keras is outside what kdist supports: run `kdist doctor`")


def _trainer():
    import keras

    return _in_hierarchy(keras.Model, *_tf_backend("trainer"))


def _base_trainer():
    import keras

    return _in_hierarchy(keras.Model, "keras.src.trainers.trainer")


def _trainer_module():
    return sys.modules[_trainer().__module__]


def _tf_optimizer():
    import keras

    return _in_hierarchy(keras.optimizers.Optimizer, *_tf_backend("optimizer"))


def _base_optimizer():
    import keras

    return _in_hierarchy(keras.optimizers.Optimizer, "keras.src.optimizers.base_optimizer")


def _public(path: str):
    def get():
        import keras

        owner = keras
        for part in path.split("."):
            owner = getattr(owner, part)
        return owner

    return get


def _backend_numpy():
    """The TensorFlow backend's NumPy ops as `keras.ops` calls them: `backend.numpy` until Keras
    3.15, `backend.ops.numpy` from 3.16."""
    backend = importlib.import_module("keras.src.backend")
    return getattr(backend, "numpy", None) or backend.ops.numpy


def _array_data_adapter():
    return importlib.import_module(
        "keras.src.trainers.data_adapters.array_data_adapter").ArrayDataAdapter


OWNERS = {
    "Trainer": _trainer,  # TensorFlowTrainer in Keras <= 3.15, Trainer from 3.16
    "BaseTrainer": _base_trainer,  # Trainer in Keras <= 3.15, BaseTrainer from 3.16
    "trainer module": _trainer_module,
    "TFEpochIterator": lambda: _trainer_module().TFEpochIterator,
    "TFOptimizer": _tf_optimizer,
    "BaseOptimizer": _base_optimizer,
    "LossScaleOptimizer": _public("optimizers.LossScaleOptimizer"),
    # The class Keras itself instantiates: keras.Variable is a subclass of it in Keras 3.5.
    "Variable": lambda: importlib.import_module("keras.src.backend").Variable,
    "Metric": _public("metrics.Metric"),
    "ArrayDataAdapter": _array_data_adapter,
    "data adapters module": lambda: importlib.import_module("keras.src.trainers.data_adapters"),
    "GeneratorDataAdapter": lambda: importlib.import_module(
        "keras.src.trainers.data_adapters.generator_data_adapter").GeneratorDataAdapter,
    "PyDatasetAdapter": lambda: importlib.import_module(
        "keras.src.trainers.data_adapters.py_dataset_adapter").PyDatasetAdapter,
    "TFDatasetAdapter": lambda: importlib.import_module(
        "keras.src.trainers.data_adapters.tf_dataset_adapter").TFDatasetAdapter,
    "Model": _public("Model"),
    "BackupAndRestore": _public("callbacks.BackupAndRestore"),
    "ModelCheckpoint": _public("callbacks.ModelCheckpoint"),
    "TensorBoard": _public("callbacks.TensorBoard"),
    "CSVLogger": _public("callbacks.CSVLogger"),
    "BatchNormalization": _public("layers.BatchNormalization"),
    "loss module": lambda: importlib.import_module("keras.src.losses.loss"),
    "backend numpy module": _backend_numpy,
    "random module": lambda: importlib.import_module("keras.src.backend").random,
    "utils module": _public("utils"),
    "ParameterServerStrategy": lambda: importlib.import_module(
        "tensorflow").distribute.experimental.ParameterServerStrategy,
    "eager context module": lambda: importlib.import_module("tensorflow.python.eager.context"),
    "multi-device iterator module": lambda: importlib.import_module(
        "tensorflow.python.data.ops.multi_device_iterator_ops"),
}


def resolve(owner: str):
    """The running Keras's class (or module) that `owner` names."""
    if owner not in OWNERS:
        raise SeamError(f"unknown seam owner {owner!r}; known: {', '.join(OWNERS)}")
    return OWNERS[owner]()
