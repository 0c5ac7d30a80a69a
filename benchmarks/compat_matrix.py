"""The version matrix: kdist's compatibility tier and both examples on every stack of .ci/stacks.

    python benchmarks/compat_matrix.py [--stacks tf2.17-keras3.5,tf2.19-keras3.10,...]

For each stack, `.ci/compat STACK` builds (or reuses) the stack's venv from the project's own files
and runs the tests marked `compat`; then the MWMS example (2 workers, the shipped digits, 4 epochs)
and the parameter-server example run in that venv. Saves benchmarks/results/compat_matrix.{json,md},
from which the table of docs/compatibility.md is generated.
"""

import argparse
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import results_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("KDIST_COMPAT_CACHE", os.path.expanduser("~/.cache/kdist-compat"))
ACCURACY = re.compile(r"(\w+): test accuracy (\d\.\d+) after (\d+) epochs")


def stacks() -> dict[str, tuple[str, str]]:
    """name -> (pins, where users meet it), from .ci/stacks."""
    found = {}
    for line in open(os.path.join(ROOT, ".ci", "stacks")):
        if line.strip() and not line.startswith("#"):
            name, tf_pin, keras_pin, *where = line.split()
            found[name] = (f"{tf_pin} {keras_pin}", " ".join(where))
    return found


def tier(stack: str) -> dict:
    """Runs `.ci/compat STACK`; returns the counts from its JUnit report."""
    run = subprocess.run([os.path.join(ROOT, ".ci", "compat"), stack], cwd=ROOT,
                         capture_output=True, text=True, timeout=3600)
    suites = ElementTree.parse(os.path.join(ROOT, ".ci", "results", f"{stack}.xml")).getroot()
    suite = suites if suites.tag == "testsuite" else suites[0]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["exit_code"] = run.returncode
    counts["tail"] = run.stdout[-1500:]
    return counts


def example(stack: str, script: str) -> dict:
    python = os.path.join(CACHE, stack, "bin", "python")
    run = subprocess.run([python, f"examples/{script}", "--data=digits", "--epochs=4"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    match = ACCURACY.search(run.stdout + run.stderr)
    return {"exit_code": run.returncode, "accuracy": float(match.group(2)) if match else None,
            "tail": (run.stdout + run.stderr)[-1500:]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stacks", default=",".join(stacks()), help="comma-separated names")
    args = parser.parse_args()
    known = stacks()
    results = {}
    for name in args.stacks.split(","):
        results[name] = {"pins": known[name][0], "where": known[name][1], "tier": tier(name),
                         "mwms_example": example(name, "mnist_multiworker.py"),
                         "ps_example": example(name, "mnist_parameter_server.py")}
        print(name, {k: v for k, v in results[name]["tier"].items() if k != "tail"}, flush=True)
    lines = ["Compatibility tier (`.ci/compat STACK`: the tests marked `compat`) and both examples "
             "(`--data=digits --epochs=4`, the digits test accuracy they print) on each stack.", "",
             "| stack | where users meet it | compat tier | MWMS example (2 workers) | "
             "PS example (chief + 2 workers + 2 ps) |", "|---|---|---|---|---|"]
    for name, r in results.items():
        t = r["tier"]
        verdict = f"{t['passed']} passed" + (f", {t['failures'] + t['errors']} failed"
                                             if t["failures"] + t["errors"] else "")
        lines.append(f"| {r['pins'].replace('==', ' ')} | {r['where']} | {verdict} | "
                     f"{_accuracy(r['mwms_example'])} | {_accuracy(r['ps_example'])} |")
    results_table.save("compat_matrix", "\n".join(lines), results)
    failed = [n for n, r in results.items() if r["tier"]["exit_code"] or
              r["mwms_example"]["exit_code"] or r["ps_example"]["exit_code"]]
    return 1 if failed else 0


def _accuracy(run: dict) -> str:
    return f"{run['accuracy']:.4f}" if run["exit_code"] == 0 and run["accuracy"] else "fails"


if __name__ == "__main__":
    sys.exit(main())
