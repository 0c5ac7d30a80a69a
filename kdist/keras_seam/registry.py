"""The one registry of what kdist changes in Keras: `Patch`, its targets, install and undo.

A patch is either a **fix** of an upstream Keras/TensorFlow bug (gated on the Keras and TensorFlow
versions it was written for, and naming the upstream report) or a **hook**: a point where a kdist
feature plugs into Keras (`kdist.keras_seam.hooks`). Both name their targets (`Target`: a Keras
class, found by what exists in the running Keras, and an attribute) and say why.

Each target is replaced once, by a composition of every active patch on it: fixes innermost (in
registry order), then hooks, then the fixes that must see what the hooks return
(`around_hooks`: clipping the gradients the exchange summed). Installing or removing one patch
recomposes its targets, so the order never depends on the order of installs, and `uninstall()`
of one patch leaves the others in place. With no patch active on a target, Keras's own attribute
is back exactly (a name Keras does not have is removed again).

>>> from kdist.keras_seam.registry import Target
>>> str(Target("Trainer", "fit"))
'Trainer.fit'
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from kdist.keras_seam import classes, versions

logger = logging.getLogger("kdist")

FIX, HOOK = "fix", "hook"
KDIST_FEATURE = "none: a kdist feature, not an upstream bug"


@dataclasses.dataclass(frozen=True)
class Target:
    """An attribute of a Keras class or module, by the name `kdist.keras_seam.classes` resolves."""

    owner: str
    attribute: str

    def resolve(self):
        return classes.resolve(self.owner)

    def __str__(self):
        return f"{self.owner}.{self.attribute}"


@dataclasses.dataclass(eq=False)
class Patch:
    """One fix or hook: its targets (`wraps`: target -> make(original) -> replacement), the
    upstream report, why it exists and the versions it targets."""

    name: str
    kind: str
    wraps: dict
    why: str
    upstream: str = KDIST_FEATURE
    keras_versions: tuple[str, str] = versions.KERAS_RANGE  # inclusive
    tf_versions: tuple[str, str] = versions.TF_RANGE  # inclusive
    fixed_in: str | None = None  # the Keras release that fixed the bug upstream, where one did
    around_hooks: bool = False  # a fix composed outside the hooks on a shared target
    rank: int = 0  # position in the registry: the composition order on a shared target
    active: bool = False
    withdrawn: bool = False  # uninstalled on purpose: kdist does not install it again by itself

    @property
    def layer(self) -> int:
        """Where it composes on a shared target: 0 fixes, 1 hooks, 2 fixes around the hooks."""
        return 1 if self.kind == HOOK else 2 if self.around_hooks else 0

    @property
    def targets(self) -> list[Target]:
        return list(self.wraps)

    def why_not_needed(self, keras_version: str, tf_version: str | None = None) -> str | None:
        """Why the bug is known absent on `keras_version` (and `tf_version`): before the Keras or
        TensorFlow release that brought it (the range's start), or from the Keras release that
        fixed it (`fixed_in`); None otherwise."""
        running = versions.version(keras_version)
        if self.fixed_in is not None and running >= versions.version(self.fixed_in):
            return f"fixed in Keras {self.fixed_in}"
        if running < versions.version(self.keras_versions[0]):
            return f"the bug came with Keras {self.keras_versions[0]}"
        if tf_version is not None and \
                versions.version(tf_version) < versions.version(self.tf_versions[0]):
            return f"the bug came with TensorFlow {self.tf_versions[0]}"
        return None

    def not_needed(self, keras_version: str, tf_version: str | None = None) -> bool:
        return self.why_not_needed(keras_version, tf_version) is not None

    def applies(self, keras_version: str, tf_version: str) -> bool:
        """Hooks apply wherever kdist runs; a fix on the versions it was written for."""
        if self.kind == HOOK:
            return True
        return (versions.in_range(keras_version, self.keras_versions)
                and versions.in_range(tf_version, self.tf_versions))

    def install(self) -> None:
        self.withdrawn = False
        if not self.active:
            for target, make in self.wraps.items():
                _point(target).add(self, make)
            self.active = True

    def uninstall(self) -> None:
        """Removes it until `install()` is called for it again (`kdist.scope()` and kdist's
        modules install only what was never withdrawn)."""
        self.withdrawn = True
        if self.active:
            for target in self.wraps:
                _point(target).remove(self)
            self.active = False


ABSENT = object()  # what `make` receives for a name the running Keras does not have


class _Point:
    """One replaced attribute and the patches composed on it."""

    def __init__(self, owner, attribute: str):
        self.owner, self.attribute = owner, attribute
        self.inherited = attribute not in vars(owner)  # restored by deleting ours
        self.original = getattr(owner, attribute, ABSENT)
        self.layers: dict[str, tuple[tuple[int, int], Callable]] = {}  # name -> (order, make)

    def add(self, patch: Patch, make: Callable) -> None:
        self.layers[patch.name] = ((patch.layer, patch.rank), make)
        self._compose()

    def remove(self, patch: Patch) -> None:
        self.layers.pop(patch.name, None)
        self._compose()

    def _compose(self) -> None:
        if not self.layers:
            if self.inherited:
                delattr(self.owner, self.attribute)
            else:
                setattr(self.owner, self.attribute, self.original)
            return
        composed = self.original
        for _, make in sorted(self.layers.values(), key=lambda layer: layer[0]):
            composed = make(composed)
        setattr(self.owner, self.attribute, composed)


_points: dict[tuple[int, str], _Point] = {}


def _point(target: Target) -> _Point:
    owner = target.resolve()
    key = (id(owner), target.attribute)
    if key not in _points:
        _points[key] = _Point(owner, target.attribute)
    return _points[key]


def ranked(patches: list[Patch]) -> list[Patch]:
    """`patches` with their registry positions set (the order they compose in)."""
    for rank, patch in enumerate(patches):
        patch.rank = rank
    return patches


def install_all(patches: list[Patch], withdrawn_too: bool = True) -> list[str]:
    """Installs every patch that targets the running Keras/TF (leaving out those uninstalled on
    purpose unless `withdrawn_too`); returns the active names."""
    import keras
    import tensorflow as tf

    versions.check_supported(keras.__version__, tf.__version__)
    for patch in patches:
        if patch.active or (patch.withdrawn and not withdrawn_too):
            continue
        if patch.applies(keras.__version__, tf.__version__):
            patch.install()
        elif patch.not_needed(keras.__version__, tf.__version__):
            logger.debug("kdist: fix %s not needed on Keras %s / TF %s: %s", patch.name,
                         keras.__version__, tf.__version__,
                         patch.why_not_needed(keras.__version__, tf.__version__))
        else:
            logger.warning("kdist: fix %s (%s) targets Keras %s..%s / TF %s..%s, not Keras %s / TF "
                           "%s: skipped. Run kdist's test suite to check this version.",
                           patch.name, patch.upstream, *patch.keras_versions, *patch.tf_versions,
                           keras.__version__, tf.__version__)
    return [p.name for p in patches if p.active]
