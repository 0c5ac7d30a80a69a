"""The TensorFlow and Keras releases kdist is tested on, and what happens outside them.

`KERAS_RANGE` and `TF_RANGE` are the inclusive ranges of the version matrix (`.ci/stacks`, which
`setup.cfg` declares too). `import kdist` reads the installed versions from the packages' metadata
(without importing TensorFlow) and prints one line when they fall outside; `kdist.scope()` refuses
a release older than the range, where kdist is known to be wrong.

>>> version("3.16.0.dev2026102704"), version("2.22.0-rc0")
((3, 16, 0), (2, 22, 0))
>>> in_range("3.15.1", KERAS_RANGE)
True
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import TypeVar

logger = logging.getLogger("kdist")

KERAS_RANGE = ("3.5.0", "3.16.99")
TF_RANGE = ("2.17.0", "2.22.99")
# The distributions that install the `keras` and `tensorflow` modules: TensorFlow 2.22 depends on
# keras-nightly, not keras; both install the same `keras` package.
KERAS_DISTRIBUTIONS = ("keras", "keras-nightly")
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-intel")

T = TypeVar("T")


class UnsupportedVersion(RuntimeError):
    """The running Keras or TensorFlow is older than the oldest release kdist is correct on."""


def version(text: str) -> tuple[int, int, int]:
    """'3.15.1' -> (3, 15, 1); pre-release, dev and local suffixes are ignored."""
    parts = (text.split("+")[0].split(".") + ["0", "0"])[:3]
    return tuple(int("".join(ch for ch in p.split("-")[0] if ch.isascii() and ch.isdigit()) or 0) for p in parts)


def in_range(running: str, bounds: tuple[str, str]) -> bool:
    return version(bounds[0]) <= version(running) <= version(bounds[1])


def _minor(text: str) -> str:
    return ".".join(str(n) for n in version(text)[:2])


def _next_minor(text: str) -> str:
    major, minor, _ = version(text)
    return f"{major}.{minor + 1}"


def tested_range(name: str) -> str:
    """'Keras 3.5-3.16' or 'TensorFlow 2.17-2.22'."""
    low, high = KERAS_RANGE if name == "Keras" else TF_RANGE
    return f"{name} {_minor(low)}-{_minor(high)}"


def check_supported(keras_version: str, tf_version: str) -> None:
    """Refuses a Keras/TF older than the supported range, naming the oldest that works; a newer
    one is allowed with a warning (untested, not known to be wrong).

    >>> check_supported("3.4.1", "2.21.0")
    Traceback (most recent call last):
    ...
    kdist.keras_seam.versions.UnsupportedVersion: Keras 3.4.1 is older than the oldest Keras kdist supports, 3.5.0: pip install "keras>=3.5,<3.17"
    """
    for name, running, (low, high), pin in (("Keras", keras_version, KERAS_RANGE, "keras"),
                                            ("TensorFlow", tf_version, TF_RANGE, "tensorflow")):
        if version(running) < version(low):
            raise UnsupportedVersion(
                f"{name} {running} is older than the oldest {name} kdist supports, {low}: "
                f'pip install "{pin}>={_minor(low)},<{_next_minor(high)}"')
        if version(running) > version(high):
            logger.warning("kdist: %s %s is newer than the newest kdist was tested with (%s); run "
                           "`kdist doctor` and kdist's test suite to check it", name, running, high)


def installed(distributions: tuple[str, ...]) -> str | None:
    """The version of the first of `distributions` that is installed (from its metadata)."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def outside_range_line() -> str | None:
    """One line naming the tested range when the installed Keras or TensorFlow is outside it,
    read from package metadata (TensorFlow is not imported); None when both are inside or absent.

    >>> outside_range_line() is None      # this environment runs a tested stack
    True
    """
    found = [(name, installed(distributions), bounds) for name, distributions, bounds in (
        ("Keras", KERAS_DISTRIBUTIONS, KERAS_RANGE), ("TensorFlow", TF_DISTRIBUTIONS, TF_RANGE))]
    outside = [(name, running) for name, running, bounds in found
               if running is not None and not in_range(running, bounds)]
    if not outside:
        return None
    running = ", ".join(f"{name} {v}" for name, v in outside)
    return (f"kdist: {running} is outside the range kdist is tested with ({tested_range('Keras')}, "
            f"{tested_range('TensorFlow')}); kdist.scope() refuses an older release, a newer one "
            "runs untested: run `kdist doctor`")


def for_running_keras(variants: dict[tuple[str, str], T]) -> T:
    """The variant whose inclusive Keras version range holds the running Keras.

    >>> for_running_keras({("3.0.0", "3.99.99"): "every supported release"})
    'every supported release'
    """
    import keras

    for bounds, variant in variants.items():
        if in_range(keras.__version__, bounds):
            return variant
    ranges = ", ".join(f"{low}..{high}" for low, high in variants)
    raise RuntimeError(f"kdist has no adapter for Keras {keras.__version__} (written for {ranges}); "
                       f"install a Keras in {KERAS_RANGE[0]}..{KERAS_RANGE[1]}")
