"""Fixes of upstream Keras 3 / TensorFlow bugs on the distributed path, in one registry.

`install()` is idempotent and is called by `kdist.scope()`; `uninstall()` restores Keras exactly (the
regression tests use it to show each bug still exists upstream).

>>> from kdist import keras_compat
>>> sorted(keras_compat.install())[:2]
['atomic_assign_under_parameter_server', 'consistent_array_shuffle']
"""

from kdist.keras_compat.fixes import WORKAROUNDS
from kdist.keras_compat.registry import KERAS_RANGE, TF_RANGE, Workaround, install_all


def install() -> list[str]:
    """Installs every fix that targets the running Keras/TF; returns the active names."""
    return install_all(WORKAROUNDS)


def uninstall() -> None:
    """Restores Keras exactly as it was before `install()`."""
    for workaround in reversed(WORKAROUNDS):
        workaround.uninstall()


__all__ = ["KERAS_RANGE", "TF_RANGE", "WORKAROUNDS", "Workaround", "install", "uninstall"]
