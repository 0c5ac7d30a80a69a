"""`kdist validate`: check a cluster-spec file."""

from __future__ import annotations

# Imported inside functions: spec files, which `kdist --help` must not load.


def add(commands) -> None:
    validate = commands.add_parser("validate", help="check a cluster-spec file")
    validate.set_defaults(run=run)
    validate.add_argument("spec", help="cluster-spec file (.json, .yaml)")


def run(args) -> int:
    from kdist.cluster.spec_file import load_spec

    spec = load_spec(args.spec)
    print(f"{args.spec}: valid; " + ", ".join(f"{n} {job}" for job, n in spec.roles.items()))
    return 0
