"""The `kdist` command line: `kdist launch` and `kdist validate`.

    kdist launch --workers 2 -- python train.py --epochs 3
    kdist launch --spec cluster_specs/local-2-workers.json -- python train.py
    kdist validate cluster_specs/local-ps.json
"""

from __future__ import annotations

import argparse
import sys

from kdist.cluster import ClusterSpec, ClusterSpecError

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kdist", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    launch = commands.add_parser(
        "launch", help="run a command as every task of a local cluster on 127.0.0.1",
        description="Runs COMMAND once per task with its own TF_CONFIG. Exit code: 0 when the "
                    "chief (or worker 0) succeeds, else the first failing task's code; 124 on "
                    "--timeout; 128+N on signal N.")
    launch.add_argument("--workers", type=int, default=None,
                        help="number of worker tasks (default 2 when no --spec)")
    launch.add_argument("--chief", action="store_true", help="add a chief task")
    launch.add_argument("--ps", type=int, default=0, help="number of parameter-server tasks")
    launch.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    launch.add_argument("--spec", help="cluster-spec file (cluster_specs/*.json|yaml) instead of "
                                       "--workers/--chief/--ps/--evaluator")
    launch.add_argument("--timeout", type=float, default=None,
                        help="stop every task after this many seconds (exit code 124)")
    launch.add_argument("--grace", type=float, default=30.0,
                        help="seconds the other workers get to finish after the leader succeeded")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")

    validate = commands.add_parser("validate", help="check a cluster-spec file")
    validate.add_argument("spec")
    return parser


def _launch_spec(args) -> ClusterSpec:
    from kdist.spec_file import load_spec

    if args.spec:
        if args.workers is not None or args.chief or args.ps or args.evaluator:
            raise ClusterSpecError("--spec", "given together with --workers/--chief/--ps/--evaluator",
                                   "describe the cluster either with --spec or with the role flags")
        return load_spec(args.spec)
    roles = {"chief": int(args.chief), "worker": 2 if args.workers is None else args.workers,
             "ps": args.ps, "evaluator": int(args.evaluator)}
    return ClusterSpec.local_layout({job: n for job, n in roles.items() if n}, source="kdist launch")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "validate":
            from kdist.spec_file import load_spec

            spec = load_spec(args.spec)
            print(f"{args.spec}: valid; " + ", ".join(f"{n} {job}" for job, n in spec.roles.items()))
            return 0
        from kdist.launcher import Launcher

        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        launcher = Launcher(_launch_spec(args), command, timeout=args.timeout, grace=args.grace)
    except (ClusterSpecError, ValueError) as err:
        print(f"kdist: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
