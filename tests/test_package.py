"""The package as users get it: a wheel installed outside the source tree, the import graph (no
cycles, a TensorFlow-free command-line side), the doctests of kdist.strategies, the README snippets."""

import ast
import doctest
import glob
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import venv

import pytest

from conftest import QUIET_TF, ROOT, run_python

SOURCE_PACKAGES = {"kdist": os.path.join(ROOT, "kdist"),
                   "kdist.strategies": os.path.join(ROOT, "strategies")}
# The command-line side: what `kdist launch/validate/tf-config/k8s/exec` import. Never TensorFlow.
TF_FREE = ("kdist", "kdist.cli", "kdist.exit_codes", "kdist.validators", "kdist.cluster",
           "kdist.launch", "kdist.k8s")


def source_modules() -> dict[str, str]:
    """Every module in the source tree, by its installed name -> file."""
    modules = {}
    for package, folder in SOURCE_PACKAGES.items():
        for directory, subdirs, files in os.walk(folder):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            relative = os.path.relpath(directory, folder)
            prefix = package if relative == "." else f"{package}.{relative.replace(os.sep, '.')}"
            for name in files:
                if name.endswith(".py"):
                    module = prefix if name == "__init__.py" else f"{prefix}.{name[:-3]}"
                    modules[module] = os.path.join(directory, name)
    return modules


def imports_of(module: str, path: str) -> set[str]:
    """The kdist modules that importing `module` and calling its functions imports: every import
    statement at any depth (inside functions too), each with the packages above the imported
    module that are not above `module` (importing a.b.c runs a.b's __init__)."""
    known = source_modules()
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
    with_packages = set()
    for name in found:
        parts = name.split(".")
        with_packages |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
    # A module's own packages are being imported already: they are not edges of its own.
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    return {m for m in with_packages if m in known and m != module and m not in own}


def test_the_import_graph_has_no_cycles():
    graph = {m: imports_of(m, p) for m, p in source_modules().items()}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, f"import cycles: {cycles}"
    assert graph["kdist.cluster.environment"] and graph["kdist.cli"], "the graph was not read"


BLOCK_TF = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('tensorflow', 'keras', 'tf_keras'):
            raise ImportError('blocked by the test: ' + name)
sys.meta_path.insert(0, Block())
"""


def test_the_command_line_side_never_imports_tensorflow(tmp_path):
    names = [m for m in source_modules() if m.startswith(TF_FREE) and
             (m in TF_FREE or m.split(".")[1] in ("cli", "cluster", "launch", "k8s"))]
    code = BLOCK_TF + f"""
import importlib
for name in {names!r}:
    importlib.import_module(name)
from kdist.cli import main
assert main(['validate', 'cluster_specs/local-ps.json']) == 0
assert main(['k8s', 'render', '--spec', 'cluster_specs/k8s-mwms.yaml', '--image', 'i:1',
             '--output', {str(tmp_path / 'out.yaml')!r}]) == 0
print('imported', len({names!r}))
"""
    result = run_python(["-c", code], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"imported {len(names)}" in result.stdout and len(names) > 15


def test_the_doctests_of_kdist_strategies_pass():
    import kdist.strategies

    modules = ["kdist.strategies"] + [f"kdist.strategies.{m.name}" for m in
                                      pkgutil.iter_modules(kdist.strategies.__path__)]
    attempted = 0
    for name in modules:
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0, name
        attempted += result.attempted
    assert attempted >= 2


# Snippets of README.md and docs/: every ```python block runs in a fresh process, except the
# ones marked <!-- fragment --> (they continue a script the reader already has).
def doc_snippets():
    pages = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
    snippets = []
    for page in pages:
        text = open(page, encoding="utf-8").read()
        found = re.findall(r"(<!-- fragment -->\n)?```python\n(.*?)```", text, flags=re.S)
        snippets += [(os.path.relpath(page, ROOT), code) for marker, code in found if not marker]
    return snippets


@pytest.mark.parametrize("page,code", doc_snippets(),
                         ids=lambda v: v if v.endswith(".md") else v.splitlines()[-1][:40])
def test_doc_snippet_runs(page, code, tmp_path):
    result = run_python(["-c", code], timeout=120, cwd=str(tmp_path))
    assert result.returncode == 0, page + "\n" + result.stdout[-2000:] + result.stderr[-4000:]


def test_the_docs_have_runnable_snippets():
    pages = {page for page, _ in doc_snippets()}
    assert "README.md" in pages and len(doc_snippets()) >= 8


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """kdist built as an sdist and a wheel, the wheel installed (not editable) into a fresh virtual
    environment that borrows TensorFlow & co from the site-packages of the interpreter running the
    suite (a venv's or the machine's): a path file lists them after the venv's own, and since a
    listed folder's own path files are not read, an editable kdist there stays out of sight."""
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "--sdist", "--wheel", "--no-isolation",
                            "--outdir", str(dist), ROOT], capture_output=True, text=True,
                           timeout=300, cwd=str(work))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheel = next(p for p in dist.iterdir() if p.suffix == ".whl")
    assert any(p.name.endswith(".tar.gz") for p in dist.iterdir())
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    site = subprocess.check_output([python, "-c", "import sysconfig; "
                                    "print(sysconfig.get_paths()['purelib'])"], text=True).strip()
    borrowed = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")
                and os.path.isdir(p)]
    assert borrowed, sys.path
    with open(os.path.join(site, "borrowed_from_the_suite.pth"), "w") as f:
        f.write("\n".join(borrowed) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install",
                              "--no-deps", "--no-index", str(wheel)],
                             capture_output=True, text=True, timeout=300, cwd=str(work))
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    outside = work / "elsewhere"
    outside.mkdir()
    return {"python": python, "bin": str(env_dir / "bin"), "wheel": wheel, "cwd": str(outside),
            "site": site}


def run_installed(wheel_env, args, timeout):
    env = {**os.environ, **QUIET_TF, "PATH": wheel_env["bin"] + os.pathsep + os.environ["PATH"]}
    env.pop("PYTHONPATH", None)
    return subprocess.run(args, cwd=wheel_env["cwd"], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_the_wheel_holds_every_module_and_only_kdist(installed_wheel):
    import zipfile

    names = zipfile.ZipFile(installed_wheel["wheel"]).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"kdist"}
    in_wheel = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in names
                if n.endswith(".py")}
    missing = sorted(set(source_modules()) - in_wheel)
    assert not missing, f"the wheel lacks {missing}"


def test_every_module_imports_from_the_installed_wheel(installed_wheel):
    """From outside the source tree, each module comes from the venv, never from this checkout."""
    code = f"""
import importlib, importlib.util
for name in {sorted(source_modules())!r}:
    # kdist.__main__ would run the command line: found, not executed
    module = importlib.util.find_spec(name) if name.endswith('__main__') else \
        importlib.import_module(name)
    assert (module.origin if name.endswith('__main__') else module.__file__).startswith({installed_wheel['site']!r}), (name, module.__file__)
print('ok')
"""
    result = run_installed(installed_wheel, [installed_wheel["python"], "-c", code], timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr[-3000:]


def test_the_installed_command_line_works(installed_wheel):
    help_ = run_installed(installed_wheel, ["kdist", "--help"], timeout=60)
    assert help_.returncode == 0 and "launch" in help_.stdout, help_.stderr
    spec = os.path.join(ROOT, "cluster_specs", "local-chief-2-workers.json")
    valid = run_installed(installed_wheel, ["kdist", "validate", spec], timeout=60)
    assert valid.returncode == 0 and "valid" in valid.stdout, valid.stderr


def test_the_example_trains_2_workers_with_the_installed_wheel(installed_wheel):
    """`pip install .` then `python examples/mnist_multiworker.py`, from another directory."""
    result = run_installed(installed_wheel, [
        installed_wheel["python"], os.path.join(ROOT, "examples", "mnist_multiworker.py"),
        "--data=digits", "--epochs=1", "--timeout=240"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[worker-1]" in result.stdout and "test accuracy" in result.stdout.lower(), \
        result.stdout[-2000:]


def doc_command_lines():
    """Every `kdist ...` command of the ```bash blocks of README.md and docs/."""
    pages = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
    commands = []
    for page in pages:
        text = open(page, encoding="utf-8").read()
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith("kdist "):
                    commands += [(os.path.relpath(page, ROOT), line)]
    return commands


def test_every_documented_kdist_command_parses():
    """The shell examples stay true to the command line: each parses (nothing is run)."""
    import shlex

    from kdist import cli

    assert len(doc_command_lines()) >= 10
    for page, line in doc_command_lines():
        words = shlex.split(line.split("&&")[0])[1:]
        try:
            cli._parser().parse_args(words)
        except SystemExit as stop:
            raise AssertionError(f"{page}: {line!r} does not parse (exit {stop.code})") from None
