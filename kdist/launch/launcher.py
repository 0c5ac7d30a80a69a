"""`kdist launch`: run one command as every task of a local cluster, like torchrun for tf.distribute.

Every task gets its own TF_CONFIG (addresses on 127.0.0.1, ports from portpicker), its output lines
prefixed with ``[worker-1]``, and its own process group. The launcher is a small state machine::

    RUNNING --leader exits 0--------------> FINISHING --rest exit or grace ends--> SUCCEEDED (0)
    RUNNING --a task fails----------------> FAILED    (that task's exit code, the rest killed)
    RUNNING --SIGINT/SIGTERM--------------> INTERRUPTED (128 + signal, every child stopped)
    RUNNING --timeout---------------------> TIMED_OUT (124, every child's stacks, then stopped)
    FAILED  --restarts left---------------> RESTARTING --every task stopped--> RUNNING
    FAILED  --same task failed last time,-> RESTARTING without that task (--min-workers)
              more than min_workers left

The leader is the chief, or worker 0 when there is no chief. After it succeeds, every other task
gets `grace` seconds to exit by itself (kdist's ps and worker servers do, once the chief is gone);
what is left is stopped. In a parameter-server cluster a worker that dies is not fatal (the chief's
coordinator reschedules its steps), and when a ps dies the chief gets `grace` seconds to fail with
its own message, whose exit code is the job's. Children also get SIGKILL from the kernel if the
launcher itself dies.

With `max_restarts` K (like torchrun), a failure stops every task and starts the whole
synchronous group again, up to K times, on the same addresses; each task sees the restart count in
``KDIST_RESTART_COUNT`` and resumes from its backup (`kdist.callbacks.BackupAndRestore`). A task
that saved a checkpoint on SIGTERM exits with `exit_codes.PREEMPTED` (75), which restarts the same way.

With `min_workers` M as well (torchrun's ``--nnodes MIN:MAX``, shrinking only), a chief or worker
that fails again right after a restart is taken for a lost host: the group restarts without it
(the later tasks of its job move up one index, TF_CONFIG is rendered anew), down to M workers.
Every task then sees ``KDIST_WORLD_SIZE_CHANGE=N->K`` (workers at launch -> now) and resumes from
its backup; `kdist.callbacks.BackupAndRestore` carries the position over to the new world size.
Each smaller restart counts against `max_restarts`; when none is left the job fails with the task's
exit code, as without `min_workers`.

By default the tasks run in a private network namespace (`kdist.launch.private_network`): they
reach each other on 127.0.0.1 and no other host reaches their unauthenticated TensorFlow ports;
``network="host"`` shares this machine's network, and where no namespace can be made the launch
warns and goes on (``network="private"`` makes that an error).

Before any task starts, the program is looked up: a missing one fails with 127 and one that is not
executable with 126 (the shell's codes), and no process is left behind.

The launcher runs this state machine; what follows a failed attempt (restart, and without which
task) is decided apart, by a pure function (`kdist.launch.policy`); starting, watching and stopping
the tasks is its backend's (`kdist.launch.backend.TaskBackend`): local processes by default
(`kdist.launch.group.TaskGroup`), or any class with the same methods (``backend=``). Whatever
the outcome, the output ends with a summary (`kdist.launch.summary`): the first task that
failed, how (its exception, a signal, an exit code), when and its last lines, and what became of
every other task; ``summary`` saves it as JSON, ``log_dir`` keeps each task's whole output in
``LOG_DIR/<task>.log``.

Extend it without subclassing: `task_command(task_type, index) -> (argv, env)` gives each task its
own command line and environment (`kdist k8s simulate` runs each pod in its own network namespace
this way), and `placement(spec)` decides which tasks start here.

A spec whose addresses are on several machines (`kdist.launch.hosts`) is launched once per machine
with the same file; each launcher starts the tasks on its own addresses (or on `host`), in this
machine's network, and succeeds when the leader does, or, where the leader runs elsewhere, when
every task here has succeeded. Restarts need every machine's tasks, so they are left to a
scheduler there (Kubernetes, Slurm).

>>> import io
>>> from kdist.cluster import ClusterSpec
>>> from kdist.launch import Launcher
>>> log = io.StringIO()
>>> Launcher(ClusterSpec.local_layout({"worker": 2}),
...          ["python", "-c", "import os; print(os.environ['TF_CONFIG'])"], output=log).run()
0
>>> '[worker-1] {"cluster":{"worker":["127.0.0.1:' in log.getvalue()
True
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import secrets
import shutil
import signal
import sys
import threading
import time
from typing import IO, Callable, Sequence

from kdist import envvars, exit_codes, safe_files
from kdist.cluster import addresses
from kdist.cluster.spec import ClusterSpec
from kdist.launch import hosts, policy, private_network
from kdist.launch import summary as summaries
from kdist.launch.backend import Task, TaskBackend
from kdist.launch.config import LaunchConfig
from kdist.launch.group import TaskGroup
from kdist.validators import UsageError

CHIEF_DONE_SIGNAL = signal.SIGUSR2  # kdist.ps.serve.CHIEF_DONE_SIGNAL (no TensorFlow import here)


class State(enum.Enum):
    RUNNING = "running"
    FINISHING = "finishing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    TIMED_OUT = "timed out"
    RESTARTING = "restarting"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one attempt of the job ended: the final state, the exit code, the task that decided it."""

    state: State
    exit_code: int
    task: str | None = None


class ProgramError(UsageError):
    """The program to launch is missing (exit code 127) or not executable (126)."""

    def __init__(self, program: str, problem: str, fix: str, exit_code: int):
        self.exit_code = exit_code
        super().__init__(program, problem, fix)


def check_program(argv: Sequence[str]) -> str:
    """The path `argv[0]` runs, or `ProgramError` (127 missing, 126 not executable), as a shell."""
    if not argv:
        raise UsageError("command", "empty", "give the program to run after '--', e.g. "
                         "kdist launch -- python train.py")
    program = argv[0]
    if os.sep in program:
        if not os.path.exists(program):
            raise ProgramError(program, "no such file", "check the path of the program to run",
                               exit_codes.NOT_FOUND)
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise ProgramError(program, "not executable", f"run it through its interpreter (e.g. "
                               f"python {program}) or chmod +x it", exit_codes.NOT_EXECUTABLE)
        return program
    found = shutil.which(program)
    if found is None:
        raise ProgramError(program, "command not found on PATH",
                           "install it, or give its full path", exit_codes.NOT_FOUND)
    return found


class Launcher:
    """Starts every task of `spec`, supervises them, returns the job's exit code.

    Args:
        spec: the cluster (without a task).
        command: argv run for every task (with `task_command`, may be None).
        config: how the launch runs (`kdist.launch.config.LaunchConfig`); or give its fields
            as keywords (``Launcher(spec, command, timeout=60)``), not both.
        output: where prefixed lines go (default: stdout).
        env: the tasks' base environment (default: this process's).
        task_command: `(task_type, index) -> (argv, env)` for each task; default: `command` with
            the task's TF_CONFIG added to `env`.
        placement: `(spec) -> [(task_type, index), ...]`, the tasks to start here, raising
            `UsageError` for a spec this launcher cannot run; default: the tasks on this
            machine's addresses (`kdist.launch.hosts.tasks_here`), or on the config's `host`.
        backend: makes the `TaskBackend` that runs one attempt's tasks (called once per
            attempt); default: local processes (`kdist.launch.group.TaskGroup`).
    """

    def __init__(self, spec: ClusterSpec, command: Sequence[str] | None,
                 config: LaunchConfig | None = None, *, output: IO[str] | None = None,
                 env: dict[str, str] | None = None,
                 task_command: Callable[[str, int], tuple[list[str], dict]] | None = None,
                 placement: Callable[[ClusterSpec], list[tuple[str, int]]] | None = None,
                 backend: Callable[[], TaskBackend] | None = None, **settings):
        self.config = config = _config(config, settings)
        self.placement = placement or (lambda cluster: hosts.tasks_here(cluster, config.host))
        self.here = self.placement(spec)
        self.multi_host = len(self.here) < len(spec.tasks())
        _check_network(spec, config.network, placement is None)
        if self.multi_host and (config.max_restarts or config.min_workers is not None):
            raise UsageError("max_restarts", "this machine runs only part of a multi-host "
                             "cluster, and a restart needs every machine's tasks",
                             "drop max_restarts and min_workers here; restart a multi-host job "
                             "with its scheduler (Kubernetes, Slurm)")
        if spec.leader is None:
            raise UsageError("cluster", "no chief and no worker to run the job",
                             "add a chief or a worker")
        self.spec = spec
        self.command = None if command is None else list(command)
        self.task_command = task_command or self.default_task_command
        if task_command is None:
            check_program(self.command or [])
        self.restarts = 0
        _check_min_workers(config.min_workers, spec, task_command)
        self.initial_workers = spec.num_workers
        self._failed_before: str | None = None  # the task that failed the previous attempt
        self.output = output or sys.stdout
        self.env = dict(os.environ if env is None else env)
        # the job's secret (kdist's TCP ring proves it, kdist.exchange.ring), drawn per launch
        # when this launch starts every task; a launch per machine cannot draw one for all: the
        # user's KDIST_JOB_SECRET, else the first worker's, shared through TF's coordination service
        if addresses.all_loopback(spec):
            self.env.setdefault(envvars.JOB_SECRET, secrets.token_hex(16))
        self.network: private_network.PrivateNetwork | None = None
        self.state = State.RUNNING
        self.outcome: Outcome | None = None
        self.summary: summaries.Summary | None = None
        self.group: TaskBackend | None = None
        self.backend = backend or (lambda: TaskGroup(self.output, self._lock, config.log_dir,
                                                     config.tf_logs, config.stop_timeout))
        self._lock = threading.Lock()
        self._signal: int | None = None
        self._reported: set[Task] = set()
        self._chief_deadline: float | None = None
        self._earlier: list[str] = []  # the failure that restarted each earlier attempt
        self._launched = time.monotonic()

    # ------------------------------------------------------------------ public
    def run(self) -> int:
        """Runs the job (restarting it as allowed); returns its exit code (see `outcome`, and
        `summary` for how each task ended)."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._launched, launched_at = time.monotonic(), time.time()
        oom_before = summaries.oom_kills()
        deadline = None if self.config.timeout is None else self._launched + self.config.timeout
        try:
            if self.config.log_dir:
                os.makedirs(self.config.log_dir, exist_ok=True)
            self._enter_network()
            while True:
                self._start_all()
                self.outcome = self._supervise(deadline)
                self.state = self.outcome.state
                if self.state is not State.FAILED:
                    return self.outcome.exit_code
                decision = policy.after_failure(self.config, policy.Attempt(
                    self.restarts, self.spec.num_workers, self.outcome.task, self._failed_before))
                if not decision.restart:
                    return self.outcome.exit_code
                self._restart(self.outcome.task, decision.without)
        finally:
            if self.group is not None:
                self._close_group()
                self._report_summary(launched_at, summaries.oom_kills() - oom_before)
            if self.network is not None:
                self.network.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def default_task_command(self, task_type: str, index: int) -> tuple[list[str], dict[str, str]]:
        """`command` with the task's TF_CONFIG in the base environment."""
        return self.command, dict(self.env, TF_CONFIG=self.spec.tf_config_json(task_type, index))

    def log(self, message: str) -> None:
        self._write(f"[kdist] {message}\n")

    # ------------------------------------------------------------------ states
    def _restart(self, failed: str | None, lost: tuple[str, int] | None) -> None:
        """Carries out `policy.after_failure`'s restart: every task again, or without `lost`."""
        self.state = State.RESTARTING
        first = self._task(*failed.rsplit("-", 1)) if failed else None
        self._earlier.append(f"{failed}: {summaries.describe(first.poll())}" if first is not None
                             else "failed")
        self._close_group()
        self.restarts += 1
        if lost is None:
            self._failed_before = failed
            self.log(f"restarting every task ({self.restarts}/{self.config.max_restarts}); "
                     f"they see {envvars.RESTART_COUNT}={self.restarts}")
        else:
            self._failed_before = None  # indices move up: the next failure is judged afresh
            self.spec = self.spec.without(*lost)
            self.here = self.placement(self.spec)
            self.log(f"{failed} failed on two starts in a row: restarting without it on "
                     f"{self.spec.num_workers} worker(s) (--min-workers "
                     f"{self.config.min_workers}) ({self.restarts}/{self.config.max_restarts}); "
                     f"they see {envvars.RESTART_COUNT}="
                     f"{self.restarts} and {envvars.WORLD_SIZE_CHANGE}={self._world_size_change()}")
        self._reported = set()
        self._chief_deadline = None
        self.state = State.RUNNING

    def _world_size_change(self) -> str | None:
        now = self.spec.num_workers
        return None if now == self.initial_workers else f"{self.initial_workers}->{now}"

    @property
    def tasks(self) -> list[Task]:
        """The processes of the attempt running now."""
        return self.group.tasks if self.group is not None else []

    def _supervise(self, deadline: float | None) -> Outcome:
        leader = self._leader()
        finish_by = None
        while True:
            if self._signal is not None:
                self.log(f"received {signal.Signals(self._signal).name}: stopping every task")
                return Outcome(State.INTERRUPTED, exit_codes.SIGNAL_BASE + self._signal)
            if deadline is not None and time.monotonic() > deadline:
                self.log(f"timed out after {self.config.timeout:g}s: every task's Python stacks "
                         "follow, then every task is stopped")
                return Outcome(State.TIMED_OUT, exit_codes.TIMED_OUT)
            if self.state is State.RUNNING:
                self._report_tolerated_failures()
            failed = next((t for t in self.tasks if t.poll() not in (None, 0)
                           and not self._tolerated(t)), None)
            if failed is not None and self.state is State.RUNNING:
                if self._chief_reports(failed, leader):
                    time.sleep(0.1)
                    continue
                self.log(f"{failed.name} exited with code {failed.poll()}: stopping the other tasks")
                self.group.stop(self.tasks, because=f"{failed.name} failed")
                return Outcome(State.FAILED, failed.poll(), failed.name)
            if self.state is State.RUNNING and leader is None and \
                    all(t.poll() == 0 for t in self.tasks):
                return Outcome(State.SUCCEEDED, exit_codes.OK)
            if self.state is State.RUNNING and leader is not None and leader.poll() == 0:
                self.state = State.FINISHING
                finish_by = time.monotonic() + self.config.grace
                self.log(f"{leader.name} succeeded; waiting up to {self.config.grace:g}s for the "
                         "other tasks to finish")
                self._servers_done()
            if self.state is State.FINISHING:
                self._report_late_failures()
                running = [t for t in self.tasks if t.poll() is None]
                if not running or time.monotonic() > finish_by:
                    if running:
                        self.log("grace period over: stopping " + ", ".join(t.name for t in running))
                        self.group.stop(running, because=f"{leader.name} had succeeded "
                                                         f"{self.config.grace:g} s before")
                    return Outcome(State.SUCCEEDED, exit_codes.OK, leader.name)
            time.sleep(0.1)

    def _servers_done(self) -> None:
        """The chief of parameter-server training succeeded: its ps and worker tasks, which only
        serve it, are told to leave now where they listen for it (`kdist.serve()` catches
        `CHIEF_DONE_SIGNAL`), not after its grace without the chief; other programs get the
        grace as before."""
        if self.spec.has_ps:
            self.group.notify([t for t in self.tasks if t.task_type in ("ps", "worker")],
                              CHIEF_DONE_SIGNAL)

    def _report_late_failures(self) -> None:
        """A task failing after the leader succeeded does not fail the job, but is logged."""
        self._report(lambda task: True, "after the leader succeeded")

    def _report_tolerated_failures(self) -> None:
        self._report(self._tolerated, "; parameter-server training goes on without it")

    def _report(self, which, reason: str) -> None:
        for task in self.tasks:
            code = task.poll()
            if code not in (None, 0) and which(task) and task not in self._reported:
                self._reported.add(task)
                self.log(f"{task.name} exited with code {code} {reason}".replace(" ;", ";"))

    def _chief_reports(self, failed: Task, leader: Task) -> bool:
        """A lost ps is the chief's to report (tasks are polled chief first, so once the chief
        fails its code wins): True while the chief runs, for at most `grace` seconds."""
        if failed.task_type != "ps" or leader is None or leader.poll() is not None:
            return False
        if self._chief_deadline is None:
            self._chief_deadline = time.monotonic() + self.config.grace
            self.log(f"{failed.name} exited with code {failed.poll()}: waiting up to "
                     f"{self.config.grace:g}s for the chief to report it")
        return time.monotonic() < self._chief_deadline

    def _leader(self) -> Task | None:
        """The task whose success is the job's: the cluster's leader, or where it runs on another
        machine, this machine's first chief/worker; None when only ps/evaluators run here."""
        candidates = [self.spec.leader] + [t for t in self.here if t[0] in ("chief", "worker")]
        return next((self._task(*t) for t in candidates if t in self.here), None)

    def _tolerated(self, task: Task) -> bool:
        """Workers of a parameter-server cluster may die: the coordinator replaces them."""
        return self.spec.has_ps and task.task_type == "worker"

    # ------------------------------------------------------------------ processes
    def _enter_network(self) -> None:
        """The tasks' network: a private namespace unless `network` is "host"; when none can be
        made, an error if "private" was asked for, else a warning naming the exposure."""
        if self.config.network == "host":
            return
        if not addresses.all_loopback(self.spec):
            self.log(private_network.multi_host_warning(
                [self.spec.address(*task) for task in self.here]))
            return
        network = private_network.PrivateNetwork()
        try:
            self.network = network.__enter__()
        except private_network.Unavailable as err:
            if self.config.network == "private":
                raise UsageError("network", f"private: {err}",
                                 "run where network namespaces are allowed, or use the host's "
                                 "network (the tasks' ports are then reachable from other hosts)")
            self.log(private_network.exposure_warning(
                [self.spec.address(*task) for task in self.spec.tasks()], str(err)))

    def _start_all(self) -> None:
        self.group = self.backend()
        tasks = []
        for task_type, index in self.here:
            argv, env = self.task_command(task_type, index)
            env = dict(env, PYTHONUNBUFFERED="1")
            env[envvars.RESTART_COUNT] = str(self.restarts)
            change = self._world_size_change()
            if change:
                env[envvars.WORLD_SIZE_CHANGE] = change
            if self.network is not None:
                argv = self.network.exec_prefix() + list(argv)
            tasks.append((task_type, index, argv, env))
        if self.config.log_dir:  # one header per attempt in each task's log
            for task_type, index, _, _ in tasks:
                with safe_log(self.config.log_dir, f"{task_type}-{index}") as log:
                    log.write(f"=== kdist launch: attempt {self.restarts} of {task_type}-{index}, "
                              f"{time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
        self.group.start(tasks, on_error=check_program)
        self.log(f"started {len(self.tasks)} task(s): "
                 + ", ".join(f"{t.name}={self.spec.address(t.task_type, t.index)}"
                             for t in self.tasks)
                 + (" on a private network (only they reach each other)"
                    if self.network is not None else ""))

    def _close_group(self) -> None:
        """Stops what still runs of this attempt (recording why) and waits for its output."""
        timeout = self.config.timeout
        why = {State.INTERRUPTED: "the launcher received a signal",
               State.TIMED_OUT: f"the job timed out after {timeout:g} s" if timeout
               else "the job timed out"}.get(self.state, "the launcher ended")
        if self.state is State.TIMED_OUT:  # where each task hangs, before it is gone
            self.group.ask_for_stacks(self.tasks, because=why)
        self.group.stop(self.tasks, because=why)
        self.group.close()

    def _report_summary(self, launched_at: float, oom_kills: int) -> None:
        self.summary = self._summary(launched_at, oom_kills)
        for line in self.summary.lines():
            self.log(line)
        if self.config.summary_path:
            self.summary.save(self.config.summary_path)
            self.log(f"summary saved in {self.config.summary_path}")

    def _summary(self, launched_at: float, oom_kills: int) -> summaries.Summary:
        ends = [summaries.TaskEnd(t.name, t.poll(),
                                  None if t.ended is None else t.ended - self._launched,
                                  t.stopped_by, t.failure(), list(t.lines), t.log_path)
                for t in self.tasks]
        failed = [e for e in ends if e.exit_code not in (0, None) and e.stopped_by is None]
        first = min(failed, key=lambda e: e.at if e.at is not None else float("inf"),
                    default=None)
        outcome = self.outcome or Outcome(self.state, exit_codes.OK)
        hint = None
        if first is not None and self.network is not None:
            hint = private_network.offline_hint(
                [json.dumps(first.failure or {}), *first.last_lines])
        return summaries.Summary(outcome.state.value, outcome.exit_code, launched_at,
                                 time.monotonic() - self._launched, self.restarts, first, ends,
                                 list(self._earlier), oom_kills, hint)

    def _task(self, task_type: str, index) -> Task:
        return next(t for t in self.tasks if (t.task_type, t.index) == (task_type, int(index)))

    def _write(self, text: str) -> None:
        with self._lock:
            self.output.write(text)
            self.output.flush()

    def _on_signal(self, signum, frame) -> None:
        self._signal = signum


def safe_log(log_dir: str, name: str):
    """A task's log file in `log_dir`, opened to append (never through a planted symlink)."""
    return safe_files.open_for_append(os.path.join(log_dir, f"{name}.log"))


def _config(config: LaunchConfig | None, settings: dict) -> LaunchConfig:
    """`config`, or one made of `settings` (its fields as keywords); never both, no other name."""
    fields = [f.name for f in dataclasses.fields(LaunchConfig)]
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        raise TypeError(f"Launcher: no setting {', '.join(unknown)}; LaunchConfig's fields are "
                        f"{', '.join(fields)}")
    if config is not None and settings:
        raise TypeError(f"Launcher: give config or its fields ({', '.join(sorted(settings))}), "
                        "not both")
    return config if config is not None else LaunchConfig(**settings)


def _check_network(spec: ClusterSpec, network: str | None, own_placement: bool) -> None:
    """A private network holds only a loopback interface: it cannot carry a cluster whose tasks
    listen on other addresses."""
    if own_placement and network == "private" and not addresses.all_loopback(spec):
        raise UsageError("network", "private: the cluster's tasks listen on this machine's "
                         "real addresses, which a private network (a loopback only) does not have",
                         "leave the network unset, or use the host's, for a multi-host spec")


def _check_min_workers(min_workers, spec: ClusterSpec, task_command) -> None:
    if min_workers is None:
        return
    if spec.has_ps:
        raise UsageError("min_workers", "a parameter-server job already goes on without a lost "
                         "worker (the coordinator reschedules its steps)",
                         "drop min_workers for a cluster with ps tasks")
    if min_workers > spec.num_workers:
        raise UsageError("min_workers", f"{min_workers} is more than the {spec.num_workers} "
                         "chief/worker task(s) launched", f"use 1 to {spec.num_workers}")
    if task_command is not None:
        raise UsageError("min_workers", "a custom task_command renders its own tasks, so the "
                         "launcher cannot drop one", "use the default task command")

