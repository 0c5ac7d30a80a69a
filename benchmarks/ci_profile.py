"""Where CI's time goes: the phases of `.ci/run`, the suites' files and their slowest tests.

    python benchmarks/ci_profile.py [--results .ci/results] [--save NAME]

Reads what `.ci/run` leaves in .ci/results: phases.tsv (each phase's wall seconds), the JUnit
reports (main.xml, STACK.xml per tier), the tiers' STACK.phases.tsv (venv build, tests) and the
per-test profiles (*.profile.jsonl, tests/suite_profile.py: wall seconds, the whole machine's CPU
seconds meanwhile, the Python processes started). Prints the phases, the time per test file, how busy the
cores were and the 25 slowest tests; --save NAME also writes benchmarks/results/NAME.{json,md}
(the phases and each suite's totals: README.md) and NAME_tests.{json,md} (per file, the slowest
tests: docs/contributing.md).
Only the standard library: it runs wherever `.ci/run` does.
"""

import argparse
import collections
import glob
import json
import os
import sys
import xml.etree.ElementTree as ElementTree

import results_table

SLOWEST = 25


def phases(results: str) -> list[dict]:
    """Each timed phase: .ci/run's, then each tier's venv build and tests."""
    rows = []
    for path in [os.path.join(results, "phases.tsv"),
                 *sorted(glob.glob(os.path.join(results, "*.phases.tsv")))]:
        if not os.path.exists(path):
            continue
        for line in open(path):
            fields = line.rstrip("\n").split("\t")
            if fields[0] != "phase" and len(fields) >= 3:
                rows.append({"phase": fields[0], "seconds": int(fields[1]),
                             "exit": int(fields[2])})
    return rows


def junit(path: str) -> list[dict]:
    """The test cases of one JUnit report: id, seconds, outcome."""
    cases = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "")
        file = module.replace(".", "/") + ".py" if module else "?"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        cases.append({"test": f"{file}::{case.get('name')}", "file": file,
                      "seconds": float(case.get("time", 0)), "outcome": outcome})
    return cases


def profile(path: str) -> dict:
    """test id -> its line of tests/suite_profile.py."""
    if not os.path.exists(path):
        return {}
    return {line["test"]: line for line in map(json.loads, open(path))}


def tiers(cases: list[dict]) -> dict:
    """The tiers' tests within a suite (tests/tiers/*.txt): how many, and their seconds."""
    sys.path.insert(0, os.path.join(results_table.ROOT, "tests"))
    from tier_marks import listed

    found = {}
    for tier in ("quick", "compat"):
        names = listed(tier)
        chosen = [case for case in cases if case["test"].split("[")[0] in names]
        found[tier] = {"tests": len(chosen), "seconds": round(sum(c["seconds"] for c in chosen))}
    return found


def suite(results: str, name: str) -> dict:
    """One suite's figures: tests, seconds per file, CPU use and the slowest tests."""
    cases = junit(os.path.join(results, f"{name}.xml"))
    lines = profile(os.path.join(results, f"{name}.profile.jsonl"))
    files = collections.defaultdict(lambda: {"tests": 0, "seconds": 0.0, "processes": 0})
    for case in cases:
        entry = files[case["file"]]
        entry["tests"] += 1
        entry["seconds"] += case["seconds"]
    for line in lines.values():
        files[line["test"].split("::")[0]]["processes"] += line["processes"]
    wall = sum(line["wall_s"] for line in lines.values())
    cpu = sum(line["cpu_s"] for line in lines.values())
    cores = next(iter(lines.values()))["cores"] if lines else os.cpu_count()
    spawning = [line for line in lines.values() if line["processes"]]
    return {
        "tests": len(cases),
        "outcomes": dict(collections.Counter(case["outcome"] for case in cases)),
        "seconds": round(sum(case["seconds"] for case in cases)),
        "profiled_wall_s": round(wall),
        "cores_busy": round(cpu / (wall * cores), 2) if wall else None,
        "tests_starting_processes": len(spawning),
        "python_processes": sum(line["processes"] for line in lines.values()),
        "their_wall_s": round(sum(line["wall_s"] for line in spawning)),
        "tiers": tiers(cases) if name == "main" else {},
        "files": {file: {**entry, "seconds": round(entry["seconds"], 1)}
                  for file, entry in sorted(files.items(), key=lambda kv: -kv[1]["seconds"])},
        "slowest": [{"test": case["test"], "seconds": round(case["seconds"], 1),
                     "cores_busy": _busy(lines.get(case["test"]))}
                    for case in sorted(cases, key=lambda c: -c["seconds"])[:SLOWEST]],
    }


def _busy(line):
    if not line or not line["wall_s"]:
        return None
    return round(line["cpu_s"] / (line["wall_s"] * line["cores"]), 2)


def totals(timed: list[dict], suites: dict) -> str:
    out = []
    if timed:
        out += ["| phase | minutes | exit |", "|---|---:|---:|"]
        out += [f"| {row['phase']} | {row['seconds'] / 60:.1f} | {row['exit']} |" for row in timed]
        out.append("")
    out += ["| suite | tests | outcomes | minutes in tests | cores busy | tests starting Python "
            "processes (their minutes) | Python processes |", "|---|---:|---|---:|---:|---:|---:|"]
    out += [f"| {name} | {f['tests']} | {_outcomes(f['outcomes'])} | {f['seconds'] / 60:.1f} | "
            f"{f['cores_busy']} | {f['tests_starting_processes']} ({f['their_wall_s'] / 60:.1f}) | "
            f"{f['python_processes']} |" for name, f in suites.items()]
    for name, f in suites.items():
        out += [f"| {name}: its `{tier}` tests | {t['tests']} | | {t['seconds'] / 60:.1f} | | | |"
                for tier, t in f["tiers"].items()]
    out += ["", "Minutes in tests add up each test's own time: where pytest runs tests side by side "
            "(`-n 2`), they exceed the phase's minutes."]
    return "\n".join(out)


def _outcomes(counts: dict) -> str:
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))


def details(suites: dict) -> str:
    out = []
    for name, figures in suites.items():
        out += ["" if out else None, f"| {name}: file | tests | seconds | Python processes |",
                "|---|---:|---:|---:|"]
        out += [f"| `{file}` | {e['tests']} | {e['seconds']} | {e['processes']} |"
                for file, e in list(figures["files"].items())[:15]]
        out += ["", f"| {SLOWEST} slowest ({name}) | seconds | cores busy |", "|---|---:|---:|"]
        out += [f"| `{s['test']}` | {s['seconds']} | {s['cores_busy']} |"
                for s in figures["slowest"]]
    return "\n".join(line for line in out if line is not None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default=os.path.join(results_table.ROOT, ".ci", "results"))
    parser.add_argument("--save", metavar="NAME",
                        help="write benchmarks/results/NAME.{json,md} and NAME_tests.{json,md}")
    args = parser.parse_args()
    timed = phases(args.results)
    names = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(args.results, "*.xml")))
    suites = {name: suite(args.results, name) for name in sorted(names, key=lambda n: n != "main")}
    if not timed and not suites:
        print(f"ci_profile: nothing in {args.results}: run .ci/run first", file=sys.stderr)
        return 1
    if args.save:
        brief = {name: {k: v for k, v in f.items() if k not in ("files", "slowest")}
                 for name, f in suites.items()}
        results_table.save(args.save, totals(timed, suites), {"phases": timed, "suites": brief})
        results_table.save(f"{args.save}_tests", details(suites), suites)
    else:
        print(totals(timed, suites) + "\n\n" + details(suites))
    return 0


if __name__ == "__main__":
    sys.exit(main())
