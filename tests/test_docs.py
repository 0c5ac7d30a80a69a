"""The documentation site builds with `mkdocs build --strict` (MkDocs + mkdocstrings: the guides
of docs/ and the API reference generated from the docstrings); a broken link, a missing anchor
or a reference the docstrings cannot resolve fails it. (The snippets of the pages run in
tests/test_package.py, their figures are checked in tests/test_readme_figures.py.)"""

import shutil
import subprocess
import sys

from conftest import ROOT, scaled


def build(root, site):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=scaled(120))


def test_the_docs_build_in_strict_mode(tmp_path):
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("ClusterSpec", "TrainingOptions", "ModelParallelDense", "PowerSGD", "split_cpu"):
        assert name in api, f"the API reference lacks {name}"


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "copy"
    for name in ("docs", "kdist", "strategies"):
        shutil.copytree(f"{ROOT}/{name}", copy / name)
    shutil.copy(f"{ROOT}/mkdocs.yml", copy / "mkdocs.yml")
    guide = copy / "docs" / "slurm.md"
    guide.write_text(guide.read_text() + "\nSee [the launcher](launcher.md#no-such-section).\n")
    result = build(copy, tmp_path / "site")
    assert result.returncode != 0 and "no-such-section" in result.stderr, result.stderr[-2000:]
