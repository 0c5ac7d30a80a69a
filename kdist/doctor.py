"""`kdist doctor`: will this process train, and with what? Each check says ok, warning or problem.

The checks, in the order a job meets them:

- **cluster**: the TF_CONFIG (or Slurm step) this process would run with, parsed as
  `kdist.cluster()` parses it: the resolved cluster and task, or the field that is wrong and the fix;
- **spec**: a cluster-spec file given with ``--spec``, validated like ``kdist validate``;
- **ports**: this task's own port is free to listen on, and each peer's port answers (a peer not
  started yet is a warning: run the doctor again once the job runs);
- **versions**: TensorFlow and Keras against the range kdist supports, and the workarounds
  `kdist.scope()` installs (`kdist.keras_seam.stack_report`);
- **gpu**: where the machine has an NVIDIA GPU (``/dev/nvidia0``), TensorFlow must see it;
- **keras**: a warning when both ``keras`` and ``keras-nightly`` are installed.

The exit code is 1 when any check found a problem, else 0; ``--json`` prints the checks as data.

>>> [(c.name, c.status) for c in cluster_checks()]      # no TF_CONFIG here
[('cluster', 'ok')]
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import sys
import tempfile

from kdist import startup
from kdist.cluster import environment, slurm
from kdist.cluster.addresses import host_of
from kdist.cluster.spec import ClusterSpecError
from kdist.cluster.spec_file import load_spec
from kdist.keras_seam.stack_report import report
from kdist.launch.group import is_tf_noise
from kdist.validators import UsageError

OK, WARNING, PROBLEM = "ok", "warning", "problem"
PROBE_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class Check:
    """One finding: what was checked, ok/warning/problem, what was seen, and the fix (if any)."""

    name: str
    status: str
    detail: str
    fix: str | None = None
    details: tuple[str, ...] = ()  # shown by `kdist doctor --verbose` (and in --json)

    def line(self, verbose: bool = False) -> str:
        return f"{self.status:8s} {self.name}: {self.detail}" + (
            f" Fix: {self.fix}" if self.fix else "") + "".join(
            f"\n  {line}" for line in (self.details if verbose else ()))


def cluster_checks(probe: bool = True) -> list[Check]:
    """The cluster this process's environment describes (as `kdist.cluster()` reads it), and with
    `probe` its ports."""
    try:
        spec = environment.cluster()
    except UsageError as err:  # ClusterSpecError, and what the Slurm reader raises
        return [Check("cluster", PROBLEM, f"{err.field}: {err.problem}", err.fix)]
    if not spec.is_distributed:
        return [Check("cluster", OK, "a single process (no TF_CONFIG, no Slurm step of several "
                                     "tasks): kdist.scope() uses this machine's devices")]
    source = "TF_CONFIG" if os.environ.get("TF_CONFIG", "").strip() else \
        "the Slurm step (SLURM_* variables)" if slurm.in_slurm_step() else "the environment"
    jobs = "; ".join(f"{job}: {', '.join(addresses)}" for job, addresses in spec.jobs.items())
    checks = [Check("cluster", OK, f"from {source}: this is task {spec.task} of {jobs}")]
    if probe:
        checks += port_checks(spec)
    return checks


def port_checks(spec) -> list[Check]:
    """This task's port is free; every peer's port answers (probed in parallel), as at start-up
    (`kdist.startup.hold_port`, `kdist.startup.probe`)."""
    checks = []
    if spec.task_type in spec.jobs:
        try:
            startup.hold_port(spec).close()
            port = spec.address(spec.task_type, spec.task_index).rpartition(":")[2]
            checks.append(Check("ports", OK, f"this task's port {port} is free"))
        except UsageError as err:
            checks.append(Check("ports", PROBLEM, err.problem, err.fix))
    peers = [address for _, address in startup.peers_of(spec, roles=tuple(spec.jobs))]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(16, len(peers)))) as pool:
        answers = list(pool.map(lambda address: startup.probe(address, PROBE_SECONDS), peers))
    silent = [(peer, answer) for peer, answer in zip(peers, answers) if answer is not None]
    if not silent:
        checks.append(Check("peers", OK, f"all {len(peers)} peer port(s) answer"))
    else:
        reasons = "; ".join(f"{peer}: {answer}" for peer, answer in silent[:4])
        checks.append(Check("peers", WARNING, f"{len(silent)} of {len(peers)} peer port(s) do not "
                            f"answer ({reasons})", "normal before the job starts; once it runs, "
                            "check that each peer is up and that a firewall lets these ports "
                            f"through (host {host_of(silent[0][0])})"))
    return checks


def spec_checks(path: str) -> list[Check]:
    try:
        spec = load_spec(path)
    except ClusterSpecError as err:
        return [Check("spec", PROBLEM, f"{err.field}: {err.problem}", err.fix)]
    return [Check("spec", OK, f"{path}: " + ", ".join(f"{n} {job}"
                                                        for job, n in spec.roles.items()))]


def stack_checks(tf_logs: bool = False) -> list[Check]:
    """TensorFlow/Keras versions and kdist's workarounds, then the GPU stack; TensorFlow's C++
    start-up logging is left out unless `tf_logs`."""
    with without_tf_logs(enabled=not tf_logs):
        lines, supported = report()
    checks = [Check("versions", OK if supported else PROBLEM, lines[0] + "; " + lines[2].removeprefix(
        "verdict: "), None if supported else "install a TensorFlow/Keras in " + lines[1]
        .removeprefix("supported: "))]
    checks.append(workarounds_check(lines[4:-1]))
    import tensorflow as tf  # already initialised by the report: the devices are listed

    checks.append(gpu_check(lines[-1], len(tf.config.list_physical_devices("GPU"))))
    return checks + keras_distribution_checks()


def workarounds_check(patches: list[str]) -> Check:
    """One line of counts; each patch and why on the lines `--verbose` shows."""
    statuses = [line.split(None, 1)[1] for line in patches]
    counted = {kind: sum(status.startswith(start) for status in statuses) for kind, start in (
        ("fixes", "installs (fix"), ("hooks", "installs (hook"), ("not needed", "not needed"),
        ("skipped", "skipped"))}
    detail = (f"kdist.scope() installs {counted['fixes']} fixes of upstream bugs and "
              f"{counted['hooks']} hooks here; {counted['not needed']} fixes are not needed on "
              f"this stack" + (f", {counted['skipped']} skipped" if counted["skipped"] else "")
              + " (`kdist doctor --verbose` lists them)")
    return Check("workarounds", OK, detail, details=tuple(line.strip() for line in patches))


def keras_distribution_checks() -> list[Check]:
    """Both `keras` and `keras-nightly` installed (TensorFlow 2.22 pulls in the latter) write the
    same `keras` package: which one Python imports depends on which was installed last."""
    from importlib import metadata

    found = {}
    for name in ("keras", "keras-nightly"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    if len(found) < 2:
        return []
    return [Check("keras", WARNING, "both keras " + found["keras"] + " and keras-nightly "
                  + found["keras-nightly"] + " are installed; they write the same package, and "
                  "the one installed last is the one Python imports",
                  "keep the one your TensorFlow requires (TensorFlow 2.22: keras-nightly): "
                  "pip uninstall -y keras keras-nightly, then reinstall it")]


@contextlib.contextmanager
def without_tf_logs(enabled: bool):
    """Runs the block with file descriptor 2 in a file, then writes back what is not TensorFlow's
    C++ start-up logging (which bypasses Python's sys.stderr and TF_CPP_MIN_LOG_LEVEL)."""
    if not enabled:
        yield
        return

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured if not is_tf_noise(line)]
            sys.stderr.write("".join(kept))


def gpu_check(devices: str, tf_gpus: int) -> Check:
    """A machine with an NVIDIA GPU whose TensorFlow sees none (`tf_gpus`) is a problem;
    `devices` is the report's line of them."""
    has_gpu = os.path.exists("/dev/nvidia0")
    if has_gpu and tf_gpus == 0:
        return Check("gpu", PROBLEM, f"this machine has an NVIDIA GPU, TensorFlow sees none "
                     f"({devices})", "install TensorFlow's CUDA libraries: pip install "
                     "'tensorflow[and-cuda]' (or kdist bundle make --cuda minimal offline)")
    return Check("gpu", OK, devices + ("" if has_gpu else " (no NVIDIA GPU on this machine)"))


def run(spec: str | None = None, tf_logs: bool = False) -> list[Check]:
    """Every check, in order."""
    checks = cluster_checks()
    if spec is not None:
        checks += spec_checks(spec)
    return checks + stack_checks(tf_logs)
