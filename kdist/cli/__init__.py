"""The `kdist` command line.

    kdist launch --workers 2 -- python train.py --epochs 3
    kdist launch --workers 2 --max-restarts 3 -- python train.py    (restart the group on failure)
    kdist launch --workers 4 --max-restarts 3 --min-workers 2 -- python train.py   (drop lost hosts)
    kdist launch --spec cluster_specs/local-2-workers.json -- python train.py
    kdist launch --spec two-machines.json -- python train.py     (on each machine of the spec)
    kdist verify --workers 2 --steps 5 -- python train.py     (the same training as one device?)
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

One module per command, its flags beside its code: `add(commands)` puts them on the parser,
`run(args)` does the work through the library, which never sees a flag (`parsing` holds what the
commands share).
"""

from __future__ import annotations

import argparse
import sys

from kdist import exit_codes
from kdist.cli import (bundle, doctor, k8s, launch, parsing, plan, pod_exec, tf_config, validate,
                       verify)
from kdist.cluster.spec import ClusterSpecError

# Imported inside functions: the launcher and the bundle's errors, which `kdist --help` must not
# load.

COMMANDS = (launch, verify, validate, tf_config, k8s, plan, doctor, bundle, pod_exec)  # --help's order


def _version() -> str:
    from importlib import metadata

    try:
        kdist_version = metadata.version("kdist")
    except metadata.PackageNotFoundError:
        kdist_version = "(not installed)"
    return f"kdist {kdist_version} (Python {sys.version.split()[0]})"


def _parser() -> parsing.Parser:
    parser = parsing.Parser(prog="kdist", description=__doc__.split("\n")[0],
                            epilog="examples:\n" + __doc__.split("\n\n")[1].rstrip(),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add(commands)
    return parser


def _command_parser(parser: parsing.Parser, args) -> parsing.Parser:
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
        return args.run(args)
    except ProgramError as err:
        print(f"kdist: error: {err}", file=sys.stderr)
        return err.exit_code
    except BundleError as err:
        print(f"kdist: error: {err}", file=sys.stderr)
        return exit_codes.USAGE
    except (ClusterSpecError, ValueError) as err:
        print(f"kdist: error: {err}", file=sys.stderr)
        return exit_codes.USAGE
