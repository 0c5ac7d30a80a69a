"""`kdist launch`: run a command as every task of a cluster (`kdist.launch.Launcher`)."""

from __future__ import annotations

import argparse
import os
import sys

from kdist.cli import parsing
from kdist.cluster.spec import MAX_LOCAL_TASKS, ClusterSpec, ClusterSpecError
from kdist.validators import UsageError

# Imported inside functions: the launcher, which `kdist --help` must not load.


def add(commands) -> None:
    launch = commands.add_parser(
        "launch", help="run a command as every task of a cluster: a local one on 127.0.0.1, or "
                       "this machine's tasks of a multi-host --spec",
        description="Runs COMMAND once per task with its own TF_CONFIG. Exit code: 0 when the "
                    "chief (or worker 0) succeeds, else the first failing task's code; 124 on "
                    "--timeout; 128+N on signal N. With a --spec whose addresses are on several "
                    "machines, run the same command on each machine: each starts its own tasks.")
    launch.set_defaults(run=run)
    launch.add_argument("--workers", type=parsing.count, default=None,
                        help="number of worker tasks (default 2 when no --spec)")
    launch.add_argument("--chief", action="store_true", help="add a chief task")
    launch.add_argument("--ps", type=parsing.count, default=0,
                        help="number of parameter-server tasks")
    launch.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    launch.add_argument("--spec", help="cluster-spec file (cluster_specs/*.json|yaml) instead of "
                                       "--workers/--chief/--ps/--evaluator")
    launch.add_argument("--host", default=None,
                        help="with a multi-host --spec: this machine's host as the spec names it "
                             "(default: the hosts that are this machine's addresses)")
    launch.add_argument("--timeout", type=parsing.seconds, default=None,
                        help="stop every task after this many seconds, once each has printed "
                             "its Python stacks (exit code 124)")
    launch.add_argument("--grace", type=parsing.grace_seconds, default=30.0,
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
    launch.add_argument("--max-restarts", type=parsing.count, default=0,
                        help="restart every task up to this many times when one fails (the "
                             "script sees KDIST_RESTART_COUNT; resume with BackupAndRestore)")
    launch.add_argument("--min-workers", type=parsing.positive_count, default=None,
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


def run(args) -> int:
    """parse -> config -> launch: the flags become a `LaunchConfig`; its errors, and the
    launcher's, are said in the flags' names."""
    from kdist.launch import Launcher, LaunchConfig, ProgramError, in_flags

    parsing.output_file(args.summary, "--summary")
    if args.log_dir is not None and os.path.exists(args.log_dir) and \
            not os.path.isdir(args.log_dir):
        raise ClusterSpecError("--log-dir", f"{args.log_dir!r} is not a directory",
                               "give a directory (created if missing)")
    spec, command = cluster(args), parsing.after_dashes(args.command)
    try:
        config = LaunchConfig(timeout=args.timeout, grace=args.grace,
                              max_restarts=args.max_restarts, min_workers=args.min_workers,
                              network=args.network, host=args.host, log_dir=args.log_dir,
                              summary=args.summary, tf_logs=args.tf_logs)
        return Launcher(spec, command, config).run()
    except ProgramError:
        raise  # the program after --, with its own exit code
    except UsageError as err:
        raise in_flags(err) from None


def cluster(args) -> ClusterSpec:
    """The cluster the flags describe: a --spec file, or the role flags' local layout."""
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
