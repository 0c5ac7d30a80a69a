"""The `kdist` command line.

    kdist launch --workers 2 -- python train.py --epochs 3
    kdist launch --workers 2 --max-restarts 3 -- python train.py    (restart the group on failure)
    kdist launch --workers 4 --max-restarts 3 --min-workers 2 -- python train.py   (drop lost hosts)
    kdist launch --spec cluster_specs/local-2-workers.json -- python train.py
    kdist launch --spec two-machines.json -- python train.py     (on each machine of the spec)
    kdist validate cluster_specs/local-ps.json
    kdist tf-config --spec cluster_specs/k8s-mwms.yaml --task worker:1 --namespace ml
    kdist tf-config --spec two-machines.json --task worker:1     (a spec with fixed addresses)
    kdist tf-config --spec cluster_specs/k8s-ps.yaml --task ps:0 --host-pattern "{role}{index}.lab"
    kdist k8s render --spec cluster_specs/k8s-mwms.yaml --image REGISTRY/train:1 -- python train.py
    kdist k8s simulate --spec cluster_specs/k8s-mwms.yaml -- python train.py   (root: pods as hosts)
    kdist exec -- python train.py          (inside a pod rendered by kdist k8s render)
    kdist plan --model examples/plan_model.py:mlp --per-replica-batch 32 --replicas 8 --bandwidth 1Gbit
    kdist bundle make --out bundle --python 3.12 --cuda minimal     (for a host without an index)
    kdist bundle verify bundle && kdist bundle install bundle --target /opt/site
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

from kdist import exit_codes, validators
from kdist.cluster.spec import MAX_LOCAL_TASKS, ClusterSpec, ClusterSpecError


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors after the command's usage, in kdist's one-line form, exit code 2;
    it keeps its own list of its options and choices (for "did you mean") and its subcommands."""

    def __init__(self, *args, **kwargs):
        self.known_words: list[str] = []  # option strings and string choices
        self.subcommands = None  # the action add_subparsers returned
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.known_words += [*action.option_strings,
                             *(c for c in (action.choices or ()) if isinstance(c, str))]
        return action

    def add_subparsers(self, **kwargs):
        self.subcommands = super().add_subparsers(**kwargs)
        return self.subcommands

    def error(self, message):
        flag, sep, problem = message.removeprefix("argument ").partition(": ")
        if not message.startswith("argument ") or not sep:
            flag, problem = self.prog, message
        self.print_usage(sys.stderr)
        sys.stderr.write(f"kdist: error: {flag}: {problem}{self._did_you_mean(problem)}. "
                         f"Fix: see '{self.prog} --help'\n")
        sys.exit(exit_codes.USAGE)

    def _did_you_mean(self, problem: str) -> str:
        """`; did you mean --workers?` for a misspelt option or subcommand."""
        import difflib

        words = re.findall(r"'([^']+)'|(--?[\w-]+)", problem.partition("(choose from")[0])
        known = self.known_words + list(self.subcommands.choices if self.subcommands else ())
        for word in (w for pair in words for w in pair if w):
            close = difflib.get_close_matches(word, known, n=1, cutoff=0.7)
            if close and close[0] != word:
                return f" (did you mean {close[0]}?)"
        return ""


def _version() -> str:
    from importlib import metadata

    try:
        kdist_version = metadata.version("kdist")
    except metadata.PackageNotFoundError:
        kdist_version = "(not installed)"
    return f"kdist {kdist_version} (Python {sys.version.split()[0]})"


def _number(kind, minimum: float, inclusive: bool, what: str):
    """An argparse type: a finite `kind` >= (or >) `minimum`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; use {what}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; use {what}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


_count = _number(int, 0, True, "a non-negative integer")
_positive_count = _number(int, 1, True, "a positive integer")
_seconds = _number(float, 0, False, "a positive number of seconds")
_grace_seconds = _number(float, 0, True, "a non-negative number of seconds")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _namespace(text: str) -> str:
    if not _NAMESPACE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Kubernetes namespace; use lower-case "
                                         "letters, digits and '-' (at most 63)")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kdist", description=__doc__.split("\n")[0],
                     epilog="examples:\n" + __doc__.split("\n\n")[1].rstrip(),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True,
                                     parser_class=_Parser)

    launch = commands.add_parser(
        "launch", help="run a command as every task of a cluster: a local one on 127.0.0.1, or "
                       "this machine's tasks of a multi-host --spec",
        description="Runs COMMAND once per task with its own TF_CONFIG. Exit code: 0 when the "
                    "chief (or worker 0) succeeds, else the first failing task's code; 124 on "
                    "--timeout; 128+N on signal N. With a --spec whose addresses are on several "
                    "machines, run the same command on each machine: each starts its own tasks.")
    launch.add_argument("--workers", type=_count, default=None,
                        help="number of worker tasks (default 2 when no --spec)")
    launch.add_argument("--chief", action="store_true", help="add a chief task")
    launch.add_argument("--ps", type=_count, default=0, help="number of parameter-server tasks")
    launch.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    launch.add_argument("--spec", help="cluster-spec file (cluster_specs/*.json|yaml) instead of "
                                       "--workers/--chief/--ps/--evaluator")
    launch.add_argument("--host", default=None,
                        help="with a multi-host --spec: this machine's host as the spec names it "
                             "(default: the hosts that are this machine's addresses)")
    launch.add_argument("--timeout", type=_seconds, default=None,
                        help="stop every task after this many seconds (exit code 124)")
    launch.add_argument("--grace", type=_grace_seconds, default=30.0,
                        help="seconds the other workers get to finish after the leader succeeded")
    launch.add_argument("--network", choices=("private", "host"), default=None,
                        help="private (the default): the tasks run in a network namespace of their "
                             "own with only a loopback interface, so no other host can reach "
                             "TensorFlow's unauthenticated gRPC ports (which listen on every "
                             "interface), and the tasks have no outside network (download data "
                             "first); without namespaces (not Linux, no util-linux, user "
                             "namespaces off) the launch warns and goes on. host: the tasks share "
                             "this machine's network")
    launch.add_argument("--private-network", dest="network", action="store_const",
                        const="private", help="same as --network private")
    launch.add_argument("--max-restarts", type=_count, default=0,
                        help="restart every task up to this many times when one fails (the "
                             "script sees KDIST_RESTART_COUNT; resume with BackupAndRestore)")
    launch.add_argument("--min-workers", type=_positive_count, default=None,
                        help="with --max-restarts: restart without a chief/worker that fails "
                             "twice in a row (a lost host), down to this many workers; the script "
                             "sees KDIST_WORLD_SIZE_CHANGE=N->K")
    launch.add_argument("--log-dir", default=None,
                        help="also write each task's whole output to LOG_DIR/<task>.log "
                             "(appended across restarts) and the summary to "
                             "LOG_DIR/summary.json")
    launch.add_argument("--summary", default=None, metavar="FILE",
                        help="write the end-of-job summary (first failure, every task's outcome) "
                             "as JSON to FILE")
    launch.add_argument("--tf-logs", action="store_true",
                        help="keep TensorFlow's C++ start-up logging in the output (left out by "
                             "default; the --log-dir files always keep it)")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")

    validate = commands.add_parser("validate", help="check a cluster-spec file")
    validate.add_argument("spec", help="cluster-spec file (.json, .yaml)")

    tf_config = commands.add_parser(
        "tf-config", help="print the TF_CONFIG of one task of a spec: its fixed addresses, or "
                          "as deployed on Kubernetes (or on hosts named by --host-pattern)")
    tf_config.add_argument("--spec", required=True, help="cluster-spec file")
    tf_config.add_argument("--task", required=True, help="TYPE:INDEX, e.g. worker:1")
    tf_config.add_argument("--namespace", type=_namespace, default=None,
                           help="the Kubernetes namespace of a roles spec (default: default)")
    tf_config.add_argument("--host-pattern", default=None,
                           help="host name of each task, with {job} (the spec's name), {role}, "
                                "{index} and {namespace}; default: the Kubernetes pod DNS name "
                                "{job}-{role}-{index}.{job}.{namespace}.svc")

    k8s = commands.add_parser("k8s", help="Kubernetes manifests")
    k8s_commands = k8s.add_subparsers(dest="k8s_command", metavar="COMMAND", required=True,
                                      parser_class=_Parser)
    render = k8s_commands.add_parser("render", help="write the manifests of a spec")
    render.add_argument("--spec", required=True, help="roles-form cluster-spec file")
    render.add_argument("--image", help="container image (default: the spec's image)")
    render.add_argument("--namespace", type=_namespace, default="default",
                        help="Kubernetes namespace of the job (default: default)")
    render.add_argument("--format", default="jobs", choices=["jobs", "tfjob", "jobset", "trainjob"],
                        help="jobs: Indexed Jobs + headless Service (no operator); tfjob: Kubeflow "
                             "TFJob; jobset: a JobSet; trainjob: a Kubeflow Trainer v2 TrainJob "
                             "and kdist's TensorFlow TrainingRuntime")
    render.add_argument("--output", help="file to write (default: stdout)")
    render.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- program and arguments (default: the spec's command)")

    simulate = k8s_commands.add_parser(
        "simulate", help="run the pods of the rendered Indexed Jobs here, each in its own network "
                         "namespace resolving the Service DNS names (root, iproute2)")
    simulate.add_argument("--spec", required=True, help="roles-form cluster-spec file")
    simulate.add_argument("--namespace", type=_namespace, default="default",
                          help="Kubernetes namespace the pods' DNS names use (default: default)")
    simulate.add_argument("--format", default="jobs", choices=["jobs", "jobset"],
                          help="rehearse the Indexed Jobs or the JobSet (its pods' DNS names)")
    simulate.add_argument("--timeout", type=_seconds, default=None,
                          help="stop every pod after this many seconds (exit code 124)")
    simulate.add_argument("command", nargs=argparse.REMAINDER,
                          help="-- program and arguments (default: the spec's command)")

    plan = commands.add_parser(
        "plan", help="predict step time, throughput and scaling efficiency from t1 (compute, "
                     "measured here) and t2 (communication: gradient bytes over the network); "
                     "recommend a batch size")
    plan.add_argument("--model", required=True,
                      help="module:function or file.py:function returning a Keras model")
    plan.add_argument("--per-replica-batch", type=_positive_count, required=True,
                      help="the batch per replica you train with now (the plan measures from a "
                           "few below it to a few above)")
    plan.add_argument("--replicas", type=_positive_count, required=True,
                      help="replicas in the cluster you plan for (workers x devices per worker)")
    plan.add_argument("--bandwidth", required=True, help="link speed per worker: 1Gbit, 1Gbps, 10Gb/s, 10G (bits) or "
                                            "125MB/s (bytes)")
    plan.add_argument("--latency", default="0us", help="per-message latency, e.g. 50us")
    plan.add_argument("--compression", default="none",
                      help="none, fp16, bf16, powersgd:RANK or topk:RATIO")
    plan.add_argument("--overlap", action="store_true",
                      help="assume communication overlaps computation: max(t1, t2) instead of "
                           "t1 + t2 (what Keras on tf.distribute achieves; kdist.scope("
                           "bucket_bytes=...) measured in between, see docs/overlap.md)")
    plan.add_argument("--host-cost", default="auto",
                      help="CPU seconds per byte of the all-reduce's software path (copies, "
                           "serialization): 'auto' measures it with 2 workers on this machine's "
                           "loopback (~15 s); a number in ns per byte; 0 for an ideal host")
    plan.add_argument("--base-batch", type=_positive_count, default=None,
                      help="the batch your learning rate was tuned at (default: --per-replica-batch)")
    plan.add_argument("--max-global-batch", type=_positive_count, default=None,
                      help="the largest global batch your model still converges at (the "
                           "recommendation stays at or below it)")
    plan.add_argument("--plot", help="write a PNG of t1, t2 and step time against the batch")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    doctor = commands.add_parser(
        "doctor", help="check what this process would train with: its TF_CONFIG or Slurm step "
                       "(the resolved cluster and task), its and its peers' ports, a spec file, "
                       "the TensorFlow/Keras versions and kdist's workarounds, the GPU stack; "
                       "exit code 1 on a problem")
    doctor.add_argument("--spec", default=None, help="also validate this cluster-spec file")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.add_argument("--tf-logs", action="store_true",
                        help="keep TensorFlow's C++ start-up logging (left out by default)")

    bundle = commands.add_parser("bundle", help="kdist and its dependencies (optionally the CUDA 12 "
                                                 "libraries) for a host without a package index")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", metavar="COMMAND", required=True,
                                            parser_class=_Parser)
    make = bundle_commands.add_parser(
        "make", help="download the wheels for a target Python and platform, pack them into "
                     "numbered xz pieces with a manifest of SHA-256 sums")
    make.add_argument("--out", required=True, help="new or empty directory for the bundle")
    make.add_argument("--requirement", action="append", default=None,
                      help="what to bundle (repeatable; default: this kdist, built from its "
                           "source, with its dependencies)")
    make.add_argument("--wheels", default=None,
                      help="pack the wheels already in this directory instead of downloading")
    make.add_argument("--cuda", default="none", choices=sorted(_bundle_sets()),
                      help="TensorFlow's CUDA 12 libraries too: minimal (a GPU registers), "
                           "nccl (and NCCL all-reduce), full (TensorFlow's and-cuda extra)")
    make.add_argument("--python", default=None, help="the target's Python, e.g. 3.12 "
                                                     "(default: this one)")
    make.add_argument("--platform", action="append", default=None,
                      help="the target's pip platform tag (repeatable; default: manylinux x86_64)")
    make.add_argument("--piece-mib", type=_number(float, 0, False, "a positive number of MiB"),
                      default=60.0, help="largest piece, in MiB (default 60)")
    verify = bundle_commands.add_parser("verify", help="check every piece against the manifest")
    verify.add_argument("bundle", help="the bundle's directory (from kdist bundle make)")
    install = bundle_commands.add_parser(
        "install", help="verify, unpack and pip install --no-index into a target directory")
    install.add_argument("bundle", help="the bundle's directory (from kdist bundle make)")
    install.add_argument("--target", required=True, help="directory to install into "
                                                         "(then PYTHONPATH=TARGET)")
    install.add_argument("--requirement", action="append", default=None,
                         help="what to install (default: every wheel of the bundle)")

    exec_ = commands.add_parser("exec", help="in a pod rendered by kdist: set TF_CONFIG from what "
                                             "the Job or JobSet gives the pod, then run the command")
    exec_.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")
    return parser


def _after_dashes(command: list[str]) -> list[str]:
    return command[1:] if command[:1] == ["--"] else command


def _task(text: str) -> tuple[str, int]:
    task_type, sep, index = text.partition(":")
    if not sep or not validators.is_digits(index):
        raise ClusterSpecError("--task", f"{text!r} is not TYPE:INDEX", "write e.g. --task worker:1")
    return task_type, int(index)


def _output_file(path: str | None, flag: str) -> None:
    """Checks, before any work, that `path` can be written (its directory exists, is writable,
    and it is a plain file or nothing yet: never a symlink, which a shared directory's other
    users could have planted, nor a device or a kernel file)."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ClusterSpecError(flag, f"{path!r} is a directory", "give a file name")
    if os.path.islink(path):
        raise ClusterSpecError(flag, f"{path!r} is a symlink, which kdist does not write through",
                               "give the file's real path")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ClusterSpecError(flag, f"{path!r} is not a regular file", "give a file's path")
    if not os.path.isdir(directory):
        raise ClusterSpecError(flag, f"directory {directory!r} does not exist",
                               "create it first, or write elsewhere")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ClusterSpecError(flag, f"{path!r} is not writable", "write to a writable location")


def _write(path: str, text: str, flag: str) -> None:
    """Writes `text` to `path` (checked by `_output_file`); an error the system reports only
    then (a full disk, a kernel file) is one line naming the flag."""
    from kdist import safe_files

    try:
        safe_files.write_text(path, text)
    except OSError as err:
        raise ClusterSpecError(flag, f"{path!r} cannot be written ({err.strerror or err})",
                               "write to a regular file in a writable directory") from None


def _launch_spec(args) -> ClusterSpec:
    from kdist.cluster.spec_file import KUBERNETES_ONLY, load_spec, read_spec

    if args.spec:
        if args.workers is not None or args.chief or args.ps or args.evaluator:
            raise ClusterSpecError("--spec", "given together with --workers/--chief/--ps/--evaluator",
                                   "describe the cluster either with --spec or with the role flags")
        kubernetes_keys = [k for k in KUBERNETES_ONLY if k in read_spec(args.spec)]
        if kubernetes_keys:
            print(f"kdist: {', '.join(kubernetes_keys)} in {args.spec} apply to Kubernetes only; "
                  "this local launch runs the command after --", file=sys.stderr)
        return load_spec(args.spec)
    roles = {"chief": int(args.chief), "worker": 2 if args.workers is None else args.workers,
             "ps": args.ps, "evaluator": int(args.evaluator)}
    if not roles["chief"] and not roles["worker"]:
        raise ClusterSpecError("--workers", "0 workers and no --chief: nothing would train",
                               "use --workers 1 or more, or add --chief")
    if sum(roles.values()) > MAX_LOCAL_TASKS:
        raise ClusterSpecError("--workers", f"{sum(roles.values())} tasks on one machine",
                               f"use at most {MAX_LOCAL_TASKS} tasks in all (--workers, --ps, "
                               "--chief, --evaluator); deploy larger jobs on Kubernetes or Slurm")
    return ClusterSpec.local_layout({job: n for job, n in roles.items() if n}, source="kdist launch")


def _plan(args) -> int:
    import json

    from kdist import planner

    _output_file(args.plot, "--plot")
    bandwidth, latency = planner.parse_bandwidth(args.bandwidth), planner.parse_latency(args.latency)
    compressor = planner.parse_compression(args.compression)
    host_cost = planner.parse_host_cost(args.host_cost)
    model_fn = planner.load_model_function(args.model)

    def progress(message: str) -> None:
        print(f"kdist plan: {message}", file=sys.stderr, flush=True)

    if host_cost is None:
        progress("measuring the host cost of an all-reduce: 2 workers on the loopback (~15 s)")
        host_cost = planner.measure_host_cost(planner.gradient_bytes(model_fn()))
    result = planner.plan(model_fn, args.per_replica_batch, args.replicas, bandwidth, latency,
                          compressor, overlap=args.overlap, host_cost=host_cost,
                          max_global_batch=args.max_global_batch, progress=progress)
    base_batch = args.base_batch or args.per_replica_batch
    if args.plot:
        planner.plot(result, args.plot)
    if args.json:
        print(json.dumps(dict(result.as_dict(base_batch), step_model="max(t1, t2)" if args.overlap
                              else "t1 + t2", bandwidth_bits=bandwidth, latency_s=latency,
                              host_cost_s_per_byte=host_cost, compression=args.compression,
                              plot=args.plot), indent=1))
        return 0
    print(f"step = {'max(t1, t2)' if args.overlap else 't1 + t2'}; bandwidth {args.bandwidth}, "
          f"latency {args.latency}, host cost {host_cost * 1e9:.2f} ns/byte, compression "
          f"{args.compression}")
    print(result.table())
    for warning in result.warnings():
        print(f"warning: {warning}")
    print(f"recommended: {result.reason()}")
    print(result.learning_rate_advice(base_batch))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _validate(args) -> int:
    from kdist.cluster.spec_file import load_spec

    spec = load_spec(args.spec)
    print(f"{args.spec}: valid; " + ", ".join(f"{n} {job}" for job, n in spec.roles.items()))
    return 0


def _tf_config(args) -> int:
    from kdist.cluster.spec_file import load_spec, read_k8s_spec, read_spec
    from kdist.k8s import render

    data = read_spec(args.spec)
    if "cluster" in data:  # fixed addresses: each machine's TF_CONFIG, as the spec names them
        for flag, value in (("--namespace", args.namespace), ("--host-pattern", args.host_pattern)):
            if value is not None:
                raise ClusterSpecError(flag, f"{args.spec} gives fixed addresses, which already "
                                       "name each task's host", f"drop {flag}, or describe the "
                                       'job with "roles" to render Kubernetes or pattern names')
        cluster = load_spec(args.spec)
    else:
        if "host" in data and args.host_pattern is None:
            raise ClusterSpecError(f"{args.spec}.host", "puts every task on one machine, on ports "
                                   "picked when kdist launch starts them, so no TF_CONFIG can be "
                                   "printed ahead", 'write the addresses under "cluster" (e.g. '
                                   '{"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}}), '
                                   "or pass --host-pattern")
        spec = read_k8s_spec(args.spec, local_host_allowed=True)
        cluster = render.kubernetes_cluster(spec, args.namespace or "default",
                                            args.host_pattern or render.HOST_PATTERN)
    print(cluster.tf_config_json(*_task(args.task)))
    return 0


def _k8s(args) -> int:
    from kdist.cluster.spec_file import read_k8s_spec
    from kdist.k8s import render
    from kdist.launch import check_program

    spec = read_k8s_spec(args.spec)
    command = _after_dashes(args.command)
    if args.k8s_command == "simulate":
        from kdist.k8s.simulate import simulate

        check_program(command or list(spec.command or ()))
        return simulate(spec, command, args.namespace, args.timeout, fmt=args.format)
    _output_file(args.output, "--output")
    manifests = render.to_yaml(render.render(spec, command, args.namespace, args.image, args.format))
    if args.output:
        _write(args.output, manifests, "--output")
    else:
        sys.stdout.write(manifests)
    return 0


def _exec(args) -> int:
    from kdist.k8s import pod
    from kdist.launch import check_program

    command = _after_dashes(args.command)
    check_program(command)
    pod.exec_with_tf_config(command)  # does not return
    return 0


def _launch(args) -> int:
    from kdist.launch import Launcher

    _output_file(args.summary, "--summary")
    if args.log_dir is not None and os.path.exists(args.log_dir) and \
            not os.path.isdir(args.log_dir):
        raise ClusterSpecError("--log-dir", f"{args.log_dir!r} is not a directory",
                               "give a directory (created if missing)")
    launcher = Launcher(_launch_spec(args), _after_dashes(args.command), timeout=args.timeout,
                        grace=args.grace, max_restarts=args.max_restarts,
                        min_workers=args.min_workers, log_dir=args.log_dir,
                        summary=args.summary, tf_logs=args.tf_logs, network=args.network,
                        host=args.host)
    return launcher.run()


def _bundle_sets():
    from kdist.bundle import CUDA_SETS

    return CUDA_SETS


def _bundle(args) -> int:
    from kdist import bundle

    if args.bundle_command == "verify":
        manifest = bundle.verify(args.bundle)
        print(f"{args.bundle}: {len(manifest['pieces'])} pieces verified, "
              f"{len(manifest['wheels'])} wheels")
        return 0
    if args.bundle_command == "install":
        try:
            os.makedirs(args.target, exist_ok=True)
        except OSError as err:
            raise ClusterSpecError("--target", f"cannot create {args.target!r} ({err.strerror})",
                                   "give a directory you can write") from None
        code = bundle.install(args.bundle, args.target, args.requirement)
        if code == 0:
            print(f"installed into {args.target}; use it with PYTHONPATH={args.target}")
        return exit_codes.USAGE if code else 0
    return _bundle_make(args, bundle)


def _bundle_make(args, bundle) -> int:
    import tempfile

    target = bundle.Target(python=args.python or bundle.Target.python,
                           platforms=tuple(args.platform or bundle.Target.platforms))
    with tempfile.TemporaryDirectory(prefix="kdist-wheels-") as downloads:
        wheels_dir = args.wheels or downloads
        if not args.wheels:
            requirements = args.requirement or [_kdist_wheel(downloads)]
            bundle.download(requirements + list(bundle.CUDA_SETS[args.cuda]), downloads, target)
        manifest = bundle.make(wheels_dir, args.out, args.piece_mib)
    total = sum(p["bytes"] for p in manifest["pieces"]) / bundle.MIB
    print(f"{args.out}: {len(manifest['wheels'])} wheels in {len(manifest['pieces'])} pieces, "
          f"{total:.1f} MiB (at most {args.piece_mib:g} MiB each)")
    return 0


def _kdist_wheel(into: str) -> str:
    """This kdist as a wheel: built from its source checkout."""
    import subprocess

    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(source, "setup.cfg")):
        raise ClusterSpecError("--requirement", "this kdist was not installed from a source "
                               "checkout, so kdist cannot build its own wheel",
                               "pass --requirement with kdist's wheel file")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                             "--wheel-dir", into, source], capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterSpecError("--requirement", f"building kdist's wheel failed "
                               f"({(result.stderr.strip().splitlines() or ['?'])[-1]})",
                               "pass --requirement with kdist's wheel file")
    return next(os.path.join(into, n) for n in os.listdir(into) if n.startswith("kdist-"))


def _doctor(args) -> int:
    import dataclasses
    import json

    from kdist import doctor

    checks = doctor.run(args.spec, args.tf_logs)
    problems = [c for c in checks if c.status == doctor.PROBLEM]
    if args.json:
        print(json.dumps({"checks": [dataclasses.asdict(c) for c in checks],
                          "problems": len(problems)}, indent=1))
    else:
        print("\n".join(c.line() for c in checks))
        print(f"{len(problems)} problem(s)" if problems else "no problems found")
    return 1 if problems else 0


_VERBS = {"doctor": _doctor, "validate": _validate, "tf-config": _tf_config, "k8s": _k8s, "plan": _plan,
          "exec": _exec, "launch": _launch, "bundle": _bundle}


def _command_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The (sub)command's parser that parsed `args`: e.g. `kdist k8s render`'s."""
    for dest in ("verb", "k8s_command", "bundle_command"):
        name = getattr(args, dest, None)
        if name is None or parser.subcommands is None:
            break
        parser = parser.subcommands.choices[name]
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one `kdist` command; every user mistake becomes one `kdist: error:` line and exit 2
    (127/126 for a program that is missing or not executable)."""
    from kdist.bundle import BundleError
    from kdist.launch import ProgramError

    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # answered by the subcommand that was given them, with its usage
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return _VERBS[args.verb](args)
    except ProgramError as err:
        print(f"kdist: error: {err}", file=sys.stderr)
        return err.exit_code
    except BundleError as err:
        print(f"kdist: error: {err}", file=sys.stderr)
        return exit_codes.USAGE
    except (ClusterSpecError, ValueError) as err:
        print(f"kdist: error: {err}", file=sys.stderr)
        return exit_codes.USAGE


if __name__ == "__main__":
    sys.exit(main())
