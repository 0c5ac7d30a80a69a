"""Every patch kdist makes to Keras (`PATCHES`: the fixes, then the hooks), and installing them.

>>> from kdist.keras_seam import patches
>>> patches.patch("gradient_exchange").kind
'hook'
"""

from kdist.keras_seam.fixes import FIXES
from kdist.keras_seam.hook_points import HOOKS
from kdist.keras_seam.registry import Patch, install_all, ranked

PATCHES = ranked(FIXES + HOOKS)  # fixes compose innermost, in this order


def install() -> list[str]:
    """Installs every fix that targets the running Keras/TF and every hook, those uninstalled
    before included; returns the active names."""
    return install_all(PATCHES)


def ensure() -> list[str]:
    """What kdist does where it needs its patches (`kdist.scope()`, `kdist.callbacks`): installs
    those never uninstalled, so that a patch a program or a test took out stays out; returns the
    active names."""
    return install_all(PATCHES, withdrawn_too=False)


def uninstall() -> None:
    """Restores Keras exactly as it was before `install()`; `ensure()` installs none of them
    again, `install()` does."""
    for patch in reversed(PATCHES):
        patch.uninstall()


def patch(name: str) -> Patch:
    """The registered patch called `name`."""
    for candidate in PATCHES:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no kdist patch {name!r}; see kdist.keras_seam.patches.PATCHES")

