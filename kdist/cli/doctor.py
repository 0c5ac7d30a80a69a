"""`kdist doctor`: check what this process would train with (`kdist.doctor`)."""

from __future__ import annotations

# Imported inside functions: kdist.doctor, which `kdist --help` must not load (it imports
# TensorFlow).


def add(commands) -> None:
    doctor = commands.add_parser(
        "doctor", help="check what this process would train with: its TF_CONFIG or Slurm step "
                       "(the resolved cluster and task), its and its peers' ports, a spec file, "
                       "the TensorFlow/Keras versions and kdist's workarounds, the GPU stack; "
                       "exit code 1 on a problem")
    doctor.set_defaults(run=run)
    doctor.add_argument("--spec", default=None, help="also validate this cluster-spec file")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.add_argument("--verbose", action="store_true",
                        help="also list each check's details (every patch kdist installs, and why)")
    doctor.add_argument("--tf-logs", action="store_true",
                        help="keep TensorFlow's C++ start-up logging (left out by default)")


def run(args) -> int:
    import dataclasses
    import json

    from kdist import doctor

    checks = doctor.run(args.spec, args.tf_logs)
    problems = [c for c in checks if c.status == doctor.PROBLEM]
    if args.json:
        print(json.dumps({"checks": [dataclasses.asdict(c) for c in checks],
                          "problems": len(problems)}, indent=1))
    else:
        print("\n".join(c.line(args.verbose) for c in checks))
        print(f"{len(problems)} problem(s)" if problems else "no problems found")
    return 1 if problems else 0
