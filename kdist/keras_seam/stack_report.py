"""The running stack against the range kdist supports, and what kdist will patch on it (shown by
`kdist doctor`).

>>> from kdist.keras_seam.stack_report import report
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

    from kdist.keras_seam import versions
    from kdist.keras_seam.patches import PATCHES

    lines = [f"kdist {importlib.metadata.version('kdist')}, Python {platform.python_version()}, "
             f"TensorFlow {tf.__version__}, Keras {keras.__version__}",
             f"supported: TensorFlow {versions.TF_RANGE[0]}..{versions.TF_RANGE[1]}, "
             f"Keras {versions.KERAS_RANGE[0]}..{versions.KERAS_RANGE[1]}"]
    try:
        versions.check_supported(keras.__version__, tf.__version__)
        supported = True
        inside = versions.in_range(keras.__version__, versions.KERAS_RANGE) and \
            versions.in_range(tf.__version__, versions.TF_RANGE)
        lines.append("verdict: supported" if inside else
                     "verdict: newer than tested: kdist runs, but run its test suite on this stack")
    except versions.UnsupportedVersion as err:
        supported = False
        lines.append(f"verdict: refused: {err}")
    lines.append("patches kdist.scope() installs here (fixes of upstream bugs, then kdist's hooks):")
    for patch in PATCHES:
        lines.append(f"  {patch.name:40s} {_status(patch, keras.__version__, tf.__version__)}")
    gpus = tf.config.list_physical_devices("GPU")
    lines.append(f"devices: {len(tf.config.list_physical_devices('CPU'))} CPU, {len(gpus)} GPU")
    return lines, supported


def _status(patch, keras_version: str, tf_version: str) -> str:
    if patch.applies(keras_version, tf_version):
        return f"installs ({patch.kind}: {patch.upstream})" if patch.kind == "fix" \
            else "installs (hook)"
    if patch.not_needed(keras_version, tf_version):
        return f"not needed: {patch.why_not_needed(keras_version, tf_version)}"
    return (f"skipped: written for Keras {patch.keras_versions[0]}..{patch.keras_versions[1]}"
            f", TF {patch.tf_versions[0]}..{patch.tf_versions[1]}")
