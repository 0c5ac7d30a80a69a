"""The tiers' lists (tests/tiers/*.txt, chosen by .ci/tiers.py) name tests that exist, and mark them."""

import ast
import os
import subprocess
import sys

import pytest
from tier_marks import ROOT, listed

TIERS = ("compat", "quick")


def _functions(path: str) -> set[str]:
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def _exists(path: str, function: str) -> bool:
    """`function` is a test of `path` (a name with dots: the doctests of a kdist module)."""
    if not os.path.exists(os.path.join(ROOT, path)):
        return False
    return "." in function or function in _functions(path)


@pytest.mark.parametrize("tier", TIERS)
def test_every_listed_test_exists(tier):
    names = listed(tier)
    assert names, f"tests/tiers/{tier}.txt lists no test"
    missing = [name for name in names if not _exists(*name.partition("::")[::2])]
    assert not missing, (f"tests/tiers/{tier}.txt names tests that no longer exist: {missing}; "
                         f"run `.ci/tiers.py measure` and `.ci/tiers.py select` to choose again")


def test_a_listed_function_is_marked_with_every_parameter():
    """`pytest -m quick --collect-only` selects the listed functions, each with all its parameters."""
    quick = listed("quick")
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "quick", "--collect-only", "-q",
                             "-p", "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = {line.split("[")[0] for line in result.stdout.splitlines() if "::" in line}
    assert collected == set(quick), (sorted(set(quick) - collected), sorted(collected - set(quick)))
