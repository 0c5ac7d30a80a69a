"""Shared by the benchmarks: print a results table and save it with its data and provenance.

Every result file says where its figures come from: the date, the commit, the machine, the
TensorFlow/Keras versions and the command that produced it. `benchmarks/readme.py` copies the
tables into README.md and docs/, and tests/test_readme_figures.py fails when a figure there has
no saved source.
"""

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def provenance() -> dict:
    """Date, commit, machine, versions and command of this run (no TensorFlow import needed)."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "machine": {"cores": os.cpu_count(), "cpu": _cpu_model(), "platform": platform.platform()},
        "versions": {name: _version(name) for name in ("tensorflow", "keras", "kdist")}
        | {"python": platform.python_version()},
        "command": " ".join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), ROOT),
                             *sys.argv[1:]]),
    }


def save(name: str, table: str, data) -> str:
    """Prints `table`; writes results/<name>.md and results/<name>.json. Returns the folder."""
    print(table)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump({"provenance": provenance(), "results": data}, f, indent=2)
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write(table + "\n")
    return RESULTS


def _commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    # Saved results and the pages they feed are not what is measured.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                ":!benchmarks/results", ":!README.md", ":!docs")
    return commit + ("+uncommitted changes" if dirty else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(distribution: str) -> str:
    for name in (distribution, f"{distribution}-nightly"):  # keras-nightly installs `keras`
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return "not installed"
