"""Every figure README.md and docs/ quote comes from a saved benchmark result, with its provenance.

Their tables are generated blocks (`<!-- results: NAME -->`, filled by benchmarks/readme.py from
benchmarks/results/NAME.md and NAME.json). Outside them the prose may quote settings and
versions, and measured figures only when a saved result holds them.
"""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PAGES = {os.path.relpath(p, ROOT): open(p, encoding="utf-8").read()
         for p in [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md"))]}
NAMES = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(RESULTS, "*.json")))

# Figures in the prose that are settings or test tolerances, not measurements; each says what it is.
SETTINGS = {
    "64 bytes": "the alignment at which TF <= 2.21 under Mirrored wrote into a generator's arrays "
                "(test_mirrored.py builds such arrays)",
    "40%": "heartbeat timeout of TF's coordination service, as a share of dead_peer_timeout "
           "(kdist.strategies.options.HEARTBEAT_SHARE)",
    "80%": "the TCP ring's wait for a silent peer, as a share of dead_peer_timeout "
           "(kdist.strategies.options.RING_SHARE)",
    "60 s": "the default dead_peer_timeout",
    "6 s": "the dead_peer_timeout the fault-tolerance test sets",
    "600 s": "the default KDIST_CHIEF_START_TIMEOUT",
    "10 s": "the default KDIST_CHIEF_GRACE",
    "95%": "the target accuracy of the compression benchmark",
    "64 x": "the per-replica batch of the examples",
    "1e-5": "the tolerance of the ModelParallelDense equivalence tests",
    "2 s": "Ray Train's default RAY_TRAIN_HEALTH_CHECK_INTERVAL_S",
    "1.10": "issue 20's overlap goal: a step within 1.10 times max(t1, t2)",
    "20%": "the CPU cap of the straggler test's cgroup (tests/conftest.py: slow_cpu_cgroup)",
    "1e-9": "kdist verify's float64 tolerance (kdist.wiring.comparison.TOLERANCE)",
    "1e-2": "kdist verify's float16 tolerance (kdist.wiring.comparison.TOLERANCE)",
    "3e-2": "kdist verify's bfloat16 tolerance (kdist.wiring.comparison.TOLERANCE)",
    "0.0312": "kdist verify's allowance per move under mixed_bfloat16, 8 x 2^-8 "
              "(kdist.wiring.comparison.ROUNDOFFS_ALLOWED)",
}
WITH_UNIT = re.compile(r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?\s?(?:ms|s|x|%|[KMG]i?B|ns|us|[MG]bit(?:/s)?"
                       r"|bytes)(?!\w)")
DECIMAL = re.compile(r"(?<![\w.\-/])\d+\.\d+(?:e-?\d+)?(?![\w.])|\d(?:\.\d+)?e-\d+")
PRODUCT = re.compile(r"tensorflow|\btf\b|keras|python|kubernetes|\bray\b|slurm|cc by", re.I)


def prose(text: str) -> list[str]:
    """A page's lines outside code blocks and generated result blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!-- results: [\w-]+ -->.*?<!-- /results -->", "", text, flags=re.S)
    return text.splitlines()


def figures(line: str) -> list[str]:
    """Measured-looking figures in one line; version numbers next to a product name are not."""
    found = WITH_UNIT.findall(line)
    if not PRODUCT.search(line):
        found += DECIMAL.findall(WITH_UNIT.sub("", re.sub(r"`[^`]*`", "", line)))
    return [f.lstrip("~") for f in found]


def saved_text() -> str:
    return "\n".join(open(p).read() for p in glob.glob(os.path.join(RESULTS, "*.*"))
                     if p.endswith((".md", ".json")))


def test_every_prose_figure_is_a_setting_or_saved():
    saved = saved_text()
    unsourced = [(page, figure, line.strip()) for page, text in PAGES.items()
                 for line in prose(text) for figure in figures(line)
                 if figure not in SETTINGS and figure not in saved]
    assert not unsourced, "figures with no saved source:\n" + "\n".join(
        f"  {figure!r} in {page}: {line}" for page, figure, line in unsourced)


def test_the_tolerances_the_docs_quote_are_kdist_verifys():
    from kdist.wiring.comparison import TOLERANCE

    assert TOLERANCE == {"float64": 1e-9, "float32": 1e-5, "float16": 1e-2, "bfloat16": 3e-2}
    assert "1e-5 for float32 (1e-9 float64, 1e-2 float16, 3e-2 bfloat16)" in \
        " ".join(PAGES["docs/diagnosing.md"].split())


def test_the_figure_check_can_fail():
    assert figures("the step takes 12.5 ms, 1.07x the plain one") == ["12.5 ms", "1.07x"]
    assert figures("Tested with TensorFlow 2.21.0 and Keras 3.15") == []
    assert figures("accuracy 0.9611 after 16 epochs") == ["0.9611"]


def test_readme_tables_are_the_saved_results():
    check = subprocess.run([sys.executable, "benchmarks/readme.py", "--check"], cwd=ROOT,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    quoted = {name for text in PAGES.values()
              for name in re.findall(r"^<!-- results: ([\w-]+) -->$", text, flags=re.M)}
    assert quoted == set(NAMES), f"saved but on no page: {set(NAMES) - quoted}; " \
                                 f"on a page but not saved: {quoted - set(NAMES)}"


@pytest.mark.parametrize("name", NAMES)
def test_result_says_where_it_comes_from(name):
    source = json.load(open(os.path.join(RESULTS, f"{name}.json")))["provenance"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", source["date"])
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), \
        f"{name}: measured on {source['commit']!r}; commit the code, then run the benchmark"
    in_history = subprocess.run(["git", "merge-base", "--is-ancestor", source["commit"], "HEAD"],
                                cwd=ROOT, capture_output=True)
    assert in_history.returncode == 0, f"{name}: commit {source['commit']} is not in this history"
    assert source["machine"]["cores"] >= 1 and source["machine"]["cpu"]
    assert all(source["versions"][k] != "not installed" for k in ("tensorflow", "keras", "kdist"))
    script = re.match(r"python benchmarks/(\w+)\.py", source["command"])
    assert script and (name == script[1] or name.startswith(script[1] + "_")), \
        f"{name}: saved by {source['command']!r}"  # NAME, or NAME_variant for a flag's run
