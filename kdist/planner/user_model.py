"""The user's model for `kdist plan`: ``module:function`` or ``file.py:function``, loaded and
checked to return a Keras model."""

from __future__ import annotations

import importlib
import importlib.util
import os

from kdist.validators import UsageError


def load_model_function(spec: str):
    """``package.module:function`` or ``path/to/file.py:function`` -> the function."""
    module_name, sep, function = spec.partition(":")
    if not sep or not function or not module_name:
        raise UsageError("--model", f"{spec!r} names no function",
                         "write module:function or path/file.py:function")
    if module_name.endswith(".py") and not os.path.isfile(module_name):
        raise UsageError("--model", f"no such file {module_name!r}", "check the path")
    try:
        if module_name.endswith(".py"):
            loaded = importlib.util.spec_from_file_location("kdist_plan_model", module_name)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:  # whatever the user's module raises while it is imported
        message = str(err).splitlines()[0] if str(err) else "no message"
        raise UsageError("--model", f"cannot import {module_name!r} ({type(err).__name__}: "
                         f"{message})", "fix the module, or the path / PYTHONPATH") from None
    if not callable(getattr(module, function, None)):
        raise UsageError("--model", f"{module_name} has no function {function!r}",
                         "name a function that returns a Keras model")
    return _checked_model_function(getattr(module, function), spec)


def _checked_model_function(function, spec: str):
    """`function` as a model function whose failures name --model: an exception it raises, or a
    return value that is not a built Keras model, becomes a `UsageError`."""
    def model_fn():
        import keras

        try:
            model = function()
        except Exception as err:  # whatever the user's function raises
            message = str(err).splitlines()[0] if str(err) else "no message"
            raise UsageError("--model", f"{spec} raised {type(err).__name__}: {message}",
                             "fix the function so that it returns a Keras model") from None
        if not isinstance(model, keras.Model):
            raise UsageError("--model", f"{spec} returned {type(model).__name__}, not a Keras "
                             "model", "return a keras.Model with its input shape (keras.Input)")
        try:
            inputs = model.inputs
        except (AttributeError, ValueError):  # a subclassed model that was never called
            inputs = None
        if not inputs:
            raise UsageError("--model", f"{spec} returned a model without input shapes",
                             "build it with keras.Input(shape) (a Sequential or functional model)")
        return model

    return model_fn
