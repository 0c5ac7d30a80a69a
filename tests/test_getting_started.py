"""The docs site's home page, docs/index.md, run as a newcomer runs it: its files written, each
command of its ```bash blocks run in order in one folder (a copy of the kdist checkout's specs).
The few commands that need what this machine lacks are run by a stand-in test, named below and
checked to exist. Also: the README's quick-start script, in the modes the README claims."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, scaled

PAGE = os.path.join(ROOT, "docs", "index.md")
# command prefix -> the test that runs it (or its equivalent) in the suite
STAND_INS = {
    "python -m venv": "tests/test_package.py::installed_wheel",
    "pip install .": "tests/test_package.py::installed_wheel",
    "kdist launch --spec two-machines.json":
        "tests/test_launcher.py::test_two_machines_train_from_one_spec_with_fixed_addresses",
    "kubectl apply":
        "tests/test_k8s.py::test_rendered_mwms_pods_train_as_separate_hosts_resolving_service_dns_names",
    "srun": "tests/test_slurm.py::test_srun_on_two_nodes_sharing_a_host_trains_like_the_local_launcher",
}


def page_parts():
    """(files: name -> text, commands: [line, ...]) of the page, in order."""
    text = open(PAGE, encoding="utf-8").read()
    files = dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S))
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        commands += [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    return files, commands


def stand_in(command):
    return next((test for prefix, test in STAND_INS.items() if command.startswith(prefix)), None)


def test_every_stand_in_test_exists():
    _, commands = page_parts()
    used = {stand_in(c) for c in commands} - {None}
    assert len(used) >= 3
    for test in used:
        path, _, name = test.partition("::")
        source = open(os.path.join(ROOT, path), encoding="utf-8").read()
        assert re.search(rf"^def {name}\(", source, re.M), test


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder like the kdist checkout a newcomer works in, with the page's files."""
    work = tmp_path_factory.mktemp("getting-started")
    shutil.copytree(os.path.join(ROOT, "cluster_specs"), work / "cluster_specs")
    for name, text in page_parts()[0].items():
        (work / name).write_text(text)
    return work


def run(command, cwd, timeout=240):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    env.pop("TF_CONFIG", None)
    return subprocess.run(["bash", "-c", command.replace("python ", f"{sys.executable} ", 1)
                           if command.startswith("python ") else command], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=scaled(timeout))


@pytest.mark.parametrize("command", [c for c in page_parts()[1] if stand_in(c) is None])
def test_the_getting_started_command_runs(command, workdir):
    result = run(command, workdir)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    if command == "python train.py":
        assert re.fullmatch(r"1 replica\(s\), loss [\d.]+\n", result.stdout.splitlines(True)[-1])
    if command.startswith("kdist launch --workers 2"):
        assert "[worker-0] 2 replica(s), loss" in result.stdout
        assert "[worker-1] 2 replica(s), loss" in result.stdout
        assert re.search(r"\[kdist\] summary: succeeded with exit code 0 after", result.stdout)
    if command.startswith("kdist verify"):
        assert "kdist verify: the same training as one device" in result.stdout
    if command.startswith("kdist launch --chief"):
        assert re.search(r"\[chief-0\] 1 replica\(s\), loss [\d.]+", result.stdout)
    if command.startswith("kdist tf-config"):
        assert '"task":{"type":"worker","index":1}' in result.stdout
        assert "10.0.0.2:2222" in result.stdout
    if command.startswith("kdist k8s render"):
        assert "kind: Job" in (workdir / "job.yaml").read_text()


def readme_quick_start():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1), section


def test_the_readme_quick_start_runs_unchanged_on_two_workers(tmp_path):
    """The README says its quick-start script runs on a cluster unchanged: under kdist launch."""
    code, section = readme_quick_start()
    assert "kdist launch --workers 2 -- python train.py" in section
    (tmp_path / "train.py").write_text(code)
    result = run("kdist launch --workers 2 -- python train.py", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for worker in (0, 1):
        assert f"[worker-{worker}] 2 replica(s)" in result.stdout


def test_a_script_next_to_the_sources_imports_the_clones_kdist(tmp_path):
    """A script saved in the clone's root, with kdist installed from the clone (not editable):
    the clone's kdist/ shadows the installed package, whose strategies/ it lacks; kdist then
    takes the clone's strategies/ folder. Emulated without reinstalling: site-packages on the
    path but not its .pth files (which install the editable finder)."""
    import site

    script = os.path.join(ROOT, f"next_to_the_sources_{os.getpid()}.py")
    with open(script, "w") as f:
        f.write("import kdist\nprint(kdist.strategies.__file__, kdist.strategies.registry.__name__)\n")
    try:
        result = subprocess.run([sys.executable, "-S", os.path.basename(script)], cwd=ROOT,
                                capture_output=True, text=True, timeout=scaled(60),
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    site.getsitepackages())})
    finally:
        os.remove(script)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [os.path.join(ROOT, "strategies", "__init__.py"),
                                     "kdist.strategies.registry"]
