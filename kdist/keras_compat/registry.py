"""The registry of upstream Keras/TensorFlow bug fixes: `Workaround`, version gates, install/undo.

Each `Workaround` names the upstream report and the Keras and TensorFlow versions it targets, and
installs only when the running versions fall in that range. Outside it, kdist logs that the patch
was skipped, so a Keras release that fixes the bug upstream is noticed, and one that does not is
caught by the regression tests (`tests/test_multi_worker.py`). Every patch is reversible:
`uninstall()` restores Keras exactly.

Only fixes of upstream bugs live here; kdist's own features (parameter-server training, gradient
compression, chief-only progress) install through `kdist.fit_dispatch` and their own packages.

>>> from kdist.keras_compat.registry import KERAS_RANGE, version
>>> version(KERAS_RANGE[0]) <= version("3.15.1") <= version(KERAS_RANGE[1])
True
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

logger = logging.getLogger("kdist")

# The versions kdist supports: each workaround gates itself inside them, and the version matrix
# (`.ci/compat`, README "Supported TensorFlow and Keras") tests stacks across them. setup.cfg
# declares the same range.
KERAS_RANGE = ("3.5.0", "3.15.99")
TF_RANGE = ("2.17.0", "2.21.99")


class UnsupportedVersion(RuntimeError):
    """The running Keras or TensorFlow is older than the oldest release kdist is correct on."""


def check_supported(keras_version: str, tf_version: str) -> None:
    """Refuses a Keras/TF older than the supported range, naming the oldest that works; a newer
    one is allowed with a warning (untested, not known to be wrong).

    >>> check_supported("3.4.1", "2.21.0")
    Traceback (most recent call last):
    ...
    kdist.keras_compat.registry.UnsupportedVersion: Keras 3.4.1 is older than the oldest Keras kdist supports, 3.5.0: pip install "keras>=3.5,<3.16"
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


def _minor(text: str) -> str:
    return ".".join(str(n) for n in version(text)[:2])


def _next_minor(text: str) -> str:
    major, minor, _ = version(text)
    return f"{major}.{minor + 1}"


def version(text: str) -> tuple[int, int, int]:
    """'3.15.1' -> (3, 15, 1); pre-release and local suffixes are ignored."""
    parts = (text.split("+")[0].split(".") + ["0", "0"])[:3]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


def in_range(running: str, bounds: tuple[str, str]) -> bool:
    return version(bounds[0]) <= version(running) <= version(bounds[1])


@dataclasses.dataclass
class Workaround:
    """One patch: what it fixes, where it was reported, which versions it targets."""

    name: str
    upstream: str
    patch: Callable[[], list[tuple[object, str, object]]]  # installs, returns (owner, attr, original)
    keras_versions: tuple[str, str] = KERAS_RANGE  # inclusive range the patch is written for
    tf_versions: tuple[str, str] = TF_RANGE  # inclusive range it was checked with
    fixed_in: str | None = None  # the Keras release that fixed the bug upstream, where one did
    active: bool = False
    _originals: list = dataclasses.field(default_factory=list, repr=False)

    def why_not_needed(self, keras_version: str) -> str | None:
        """Why the bug is known absent on `keras_version`: before the Keras release that brought it
        (the range's start), or from the one that fixed it (`fixed_in`); None otherwise."""
        running = version(keras_version)
        if self.fixed_in is not None and running >= version(self.fixed_in):
            return f"fixed in Keras {self.fixed_in}"
        if running < version(self.keras_versions[0]):
            return f"the bug came with Keras {self.keras_versions[0]}"
        return None

    def not_needed(self, keras_version: str) -> bool:
        return self.why_not_needed(keras_version) is not None

    def applies(self, keras_version: str, tf_version: str) -> bool:
        return in_range(keras_version, self.keras_versions) and in_range(tf_version, self.tf_versions)

    def install(self) -> None:
        if not self.active:
            self._originals = self.patch()
            self.active = True

    def uninstall(self) -> None:
        undo(self._originals)
        self._originals, self.active = [], False


_INHERITED = object()  # marks an attribute that `owner` only inherited: undo deletes it


def replace(owner, attr: str, make: Callable) -> tuple[object, str, object]:
    """Sets `owner.attr = make(original)`; returns what `undo` needs to restore it."""
    original = getattr(owner, attr)
    inherited = attr not in vars(owner)
    setattr(owner, attr, make(original))
    return owner, attr, _INHERITED if inherited else original


def undo(originals: list[tuple[object, str, object]]) -> None:
    """Restores what `replace` changed, newest first."""
    for owner, attr, original in reversed(originals):
        if original is _INHERITED:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)


def install_all(workarounds: list[Workaround]) -> list[str]:
    """Installs every workaround that targets the running Keras/TF; returns the active names."""
    import keras
    import tensorflow as tf

    check_supported(keras.__version__, tf.__version__)
    for workaround in workarounds:
        if workaround.active:
            continue
        if workaround.applies(keras.__version__, tf.__version__):
            workaround.install()
        elif workaround.not_needed(keras.__version__):
            logger.debug("kdist: workaround %s not needed on Keras %s: %s", workaround.name,
                         keras.__version__, workaround.why_not_needed(keras.__version__))
        else:
            logger.warning("kdist: workaround %s (%s) targets Keras %s..%s / TF %s..%s, not Keras %s "
                           "/ TF %s: skipped. Run kdist's test suite to check this version.",
                           workaround.name, workaround.upstream, *workaround.keras_versions,
                           *workaround.tf_versions, keras.__version__, tf.__version__)
    return [w.name for w in workarounds if w.active]
