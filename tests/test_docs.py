"""The documentation site builds with `mkdocs build --strict` (MkDocs with the Material theme +
mkdocstrings: the guides of docs/ and the API reference generated from the docstrings); a broken
link, a missing anchor or a reference the docstrings cannot resolve fails it. It is laid out for
users (the navigation's sections), its API page shows the public API once, its code is
highlighted when it is built and it loads nothing from another host. (The snippets of the pages
run in tests/test_package.py, their figures are checked in tests/test_readme_figures.py.)"""

import glob
import html
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

import kdist
from conftest import ROOT, scaled

SECTIONS = ["Getting started", "Examples", "User guide", "Deploy", "Reference", "Contributing"]


def build(root, site):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=scaled(120))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    result = build(ROOT, site)
    assert result.returncode == 0, result.stderr[-4000:]
    return site


def headings(page: str) -> list[tuple[int, str]]:
    """(level, the heading's name: its first word, a signature's name) of an HTML page."""
    found = []
    for level, text in re.findall(r"<h([1-6])[^>]*>(.*?)</h\1>", page, flags=re.S):
        words = html.unescape(re.sub("<[^>]+>", "", text)).replace("\u00b6", "").split()
        found.append((int(level), re.split(r"[(:]", words[0])[0] if words else ""))
    return found


def test_the_docs_build_in_strict_mode(site):
    api = (site / "api" / "index.html").read_text()
    for name in ("ClusterSpec", "TrainingOptions", "ModelParallelDense", "PowerSGD", "split_cpu"):
        assert name in api, f"the API reference lacks {name}"


def test_the_navigation_is_a_users(site):
    nav = yaml.safe_load(open(os.path.join(ROOT, "mkdocs.yml")))["nav"]
    assert [next(iter(entry)) for entry in nav] == SECTIONS
    contributing = next(entry["Contributing"] for entry in nav if "Contributing" in entry)
    assert [next(iter(page)) for page in contributing] == ["Running the tests", "Design",
                                                           "Patches of Keras",
                                                           "Benchmarks"]


def test_the_api_page_shows_the_public_api_once(site):
    found = headings((site / "api" / "index.html").read_text())
    objects = [name for level, name in found if level == 3]
    assert len(objects) == len(set(objects)), sorted(n for n in objects if objects.count(n) > 1)
    modules = {"callbacks", "compression", "layers", "balance"}
    for name in set(kdist.__all__) - modules:
        assert name in objects, f"{name} (kdist.__all__) has no entry"
    for internal in ("parse", "checked_for", "choose", "build", "safe_log", "from_kwargs"):
        assert internal not in [name for _, name in found], internal


def test_code_is_highlighted_when_built_and_nothing_comes_from_another_host(site):
    start = (site / "index.html").read_text()
    assert '<span class="kn">import</span>' in start  # Pygments, at build time
    for page in glob.glob(str(site / "**" / "*.html"), recursive=True):
        text = open(page, encoding="utf-8").read()
        assert not re.search(r"""<(script|img)[^>]*src=["']https?://""", text), page
        assert not re.search(r"""<link[^>]*href=["']https?://""", text), page


def test_the_examples_page_lists_every_example_with_a_command_that_exists():
    page = open(os.path.join(ROOT, "docs", "examples.md"), encoding="utf-8").read()
    examples = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "examples", "*.py"))}
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", page, flags=re.M))
    assert listed == examples - {"mnist_data.py"}
    for script in re.findall(r"(examples/\w+\.py)", page):
        assert os.path.exists(os.path.join(ROOT, script)), script


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "copy"
    for name in ("docs", "kdist", "strategies"):
        shutil.copytree(f"{ROOT}/{name}", copy / name)
    shutil.copy(f"{ROOT}/mkdocs.yml", copy / "mkdocs.yml")
    guide = copy / "docs" / "slurm.md"
    guide.write_text(guide.read_text() + "\nSee [the launcher](launcher.md#no-such-section).\n")
    result = build(copy, tmp_path / "site")
    assert result.returncode != 0 and "no-such-section" in result.stderr, result.stderr[-2000:]
