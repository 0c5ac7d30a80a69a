"""The benchmark scripts stay runnable against the package as it is: CI does not run them (they are
long and want an idle machine), so every kdist name they import is checked here to exist. A
refactor that moves or removes one fails this test, not the next person's benchmark run."""

import ast
import glob
import importlib
import os

import pytest

from conftest import ROOT

SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "**", "*.py"), recursive=True))


def kdist_imports(path: str) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) of every kdist import in the script, at any depth."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and \
                (node.module or "").split(".")[0] == "kdist":
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names
                      if alias.name.split(".")[0] == "kdist"]
    return found


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_kdist_name_a_benchmark_imports_exists(path):
    missing = []
    for line, module, name in kdist_imports(path):
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            missing.append(f"line {line}: {module} ({err})")
            continue
        if name is not None and not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"line {line}: {module}.{name}")
    assert not missing, f"{os.path.relpath(path, ROOT)} imports what kdist no longer has: {missing}"


def test_the_scripts_were_read():
    assert len(SCRIPTS) >= 15
    assert sum(len(kdist_imports(p)) for p in SCRIPTS) >= 20
