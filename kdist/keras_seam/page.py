"""The page that lists every patch kdist makes to Keras, generated from the registry itself.

    python -m kdist.keras_seam.page > docs/patches.md

The test suite checks that the committed page is what this prints (`tests/test_seam.py`).

>>> render().splitlines()[0]
'# What kdist changes in Keras'
"""

from __future__ import annotations

import sys

from kdist.keras_seam import versions
from kdist.keras_seam.patches import PATCHES
from kdist.keras_seam.registry import FIX

HEADER = """# What kdist changes in Keras

Generated from `kdist.keras_seam.patches.PATCHES` by `python -m kdist.keras_seam.page`; do not edit.

Every change kdist makes to Keras is one of these patches, installed by `kdist.scope()` (and by
`import kdist.callbacks` or a model-parallel layer) through `kdist.keras_seam`, the only package that
touches Keras or TensorFlow internals. A **fix** works around an upstream bug, names its report and
installs only on the Keras and TensorFlow versions it was written for; its regression test shows the
bug upstream. A **hook** is a point where a kdist feature plugs in; it calls kdist's `Hooks` and leaves
objects kdist is not responsible for to Keras. Targets name Keras classes by role: `Trainer` is
`TensorFlowTrainer` before Keras 3.16 and `Trainer` from 3.16, `BaseTrainer` is `Trainer` before 3.16
(`kdist.keras_seam.classes`). `kdist doctor --verbose` shows which install on the running stack.

Tested range: {keras}, {tf}.
"""


def _versions(patch) -> str:
    if patch.kind != FIX:
        return "every supported"
    keras = f"Keras {patch.keras_versions[0]}..{patch.keras_versions[1]}"
    fixed = f" (fixed in {patch.fixed_in})" if patch.fixed_in else ""
    return f"{keras}{fixed}, TF {patch.tf_versions[0]}..{patch.tf_versions[1]}"


def render() -> str:
    """The page, as markdown."""
    lines = [HEADER.format(keras=versions.tested_range("Keras"),
                           tf=versions.tested_range("TensorFlow")),
             "| patch | kind | targets | upstream | versions | why |",
             "|---|---|---|---|---|---|"]
    for patch in PATCHES:
        targets = "<br>".join(f"`{target}`" for target in patch.targets)
        lines.append(f"| `{patch.name}` | {patch.kind} | {targets} | {patch.upstream} | "
                     f"{_versions(patch)} | {patch.why} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
