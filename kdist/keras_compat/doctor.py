"""`kdist doctor`: is this Python environment a stack kdist supports, and what will kdist patch?

>>> from kdist.keras_compat.doctor import report
>>> lines, supported = report()
>>> supported, lines[0].startswith("kdist ")
(True, True)
"""

from __future__ import annotations

import importlib.metadata
import platform


def report() -> tuple[list[str], bool]:
    """The lines `kdist doctor` prints, and whether the running Keras/TF are supported."""
    import keras
    import tensorflow as tf

    from kdist.keras_compat import WORKAROUNDS, registry

    lines = [f"kdist {importlib.metadata.version('kdist')}, Python {platform.python_version()}, "
             f"TensorFlow {tf.__version__}, Keras {keras.__version__}",
             f"supported: TensorFlow {registry.TF_RANGE[0]}..{registry.TF_RANGE[1]}, "
             f"Keras {registry.KERAS_RANGE[0]}..{registry.KERAS_RANGE[1]}"]
    try:
        registry.check_supported(keras.__version__, tf.__version__)
        supported = True
        inside = registry.in_range(keras.__version__, registry.KERAS_RANGE) and \
            registry.in_range(tf.__version__, registry.TF_RANGE)
        lines.append("verdict: supported" if inside else
                     "verdict: newer than tested: kdist runs, but run its test suite on this stack")
    except registry.UnsupportedVersion as err:
        supported = False
        lines.append(f"verdict: refused: {err}")
    lines.append("workarounds kdist.scope() installs here:")
    for workaround in WORKAROUNDS:
        lines.append(f"  {workaround.name:40s} {_status(workaround, keras.__version__, tf.__version__)}")
    gpus = tf.config.list_physical_devices("GPU")
    lines.append(f"devices: {len(tf.config.list_physical_devices('CPU'))} CPU, {len(gpus)} GPU")
    return lines, supported


def _status(workaround, keras_version: str, tf_version: str) -> str:
    if workaround.applies(keras_version, tf_version):
        return f"installs ({workaround.upstream})"
    if workaround.not_needed(keras_version):
        return f"not needed: {workaround.why_not_needed(keras_version)}"
    return (f"skipped: written for Keras {workaround.keras_versions[0]}..{workaround.keras_versions[1]}"
            f", TF {workaround.tf_versions[0]}..{workaround.tf_versions[1]}")
