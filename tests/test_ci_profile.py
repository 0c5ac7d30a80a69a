"""CI's profile: tests/suite_profile.py records each test, benchmarks/ci_profile.py says where the
time went (the phases, the files, the slowest tests, the Python processes started)."""

import os
import subprocess
import sys

from conftest import ROOT

SAMPLE = '''
import subprocess, sys, time

def test_starts_a_python_process():
    subprocess.run([sys.executable, "-c", "import time; time.sleep(1.0)"], check=True)

def test_waits():
    time.sleep(0.3)
'''


def test_a_run_profile_names_its_phases_slowest_tests_and_processes(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_sample.py").write_text(SAMPLE)
    results = tmp_path / "results"
    results.mkdir()
    (results / "phases.tsv").write_text("phase\tseconds\texit\tcommand\ninstall\t61\t0\tpip\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "suite_profile", f"--junitxml={results / 'main.xml'}",
                          "tests/test_sample.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests"),
                                           "KDIST_SUITE_PROFILE": str(results / "main.profile.jsonl")})
    assert run.returncode == 0, run.stdout + run.stderr
    shown = subprocess.run([sys.executable, "benchmarks/ci_profile.py", "--results", str(results)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "| install | 1.0 | 0 |" in lines
    assert any(line.startswith("| main | 2 | 2 passed |") and line.endswith("| 1 |")
               for line in lines), shown.stdout  # one Python process started, by one test
    slowest = [line for line in lines if line.startswith("| `tests/test_sample.py::")]
    assert slowest[0].startswith("| `tests/test_sample.py::test_starts_a_python_process` |")
    assert slowest[1].startswith("| `tests/test_sample.py::test_waits` | 0.3 |")
