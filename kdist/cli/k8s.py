"""`kdist k8s render` (the manifests of a spec) and `kdist k8s simulate` (their pods, here)."""

from __future__ import annotations

import argparse
import sys

from kdist.cli import parsing

# Imported inside functions: the renderers and the launcher, which `kdist --help` must not load.


def add(commands) -> None:
    k8s = commands.add_parser("k8s", help="Kubernetes manifests")
    k8s.set_defaults(run=run)
    k8s_commands = k8s.add_subparsers(dest="k8s_command", metavar="COMMAND", required=True)
    render = k8s_commands.add_parser("render", help="write the manifests of a spec")
    render.add_argument("--spec", required=True, help="roles-form cluster-spec file")
    render.add_argument("--image", help="container image (default: the spec's image)")
    render.add_argument("--namespace", type=parsing.namespace, default="default",
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
    simulate.add_argument("--namespace", type=parsing.namespace, default="default",
                          help="Kubernetes namespace the pods' DNS names use (default: default)")
    simulate.add_argument("--format", default="jobs", choices=["jobs", "jobset"],
                          help="rehearse the Indexed Jobs or the JobSet (its pods' DNS names)")
    simulate.add_argument("--timeout", type=parsing.seconds, default=None,
                          help="stop every pod after this many seconds (exit code 124)")
    simulate.add_argument("command", nargs=argparse.REMAINDER,
                          help="-- program and arguments (default: the spec's command)")


def run(args) -> int:
    from kdist.cluster.spec_file import read_k8s_spec
    from kdist.k8s import render, security
    from kdist.launch import check_program

    spec = read_k8s_spec(args.spec)
    command = parsing.after_dashes(args.command)
    if args.k8s_command == "simulate":
        from kdist.k8s.simulate import simulate

        check_program(command or list(spec.command or ()))
        return simulate(spec, command, args.namespace, args.timeout, fmt=args.format)
    parsing.output_file(args.output, "--output")
    manifests = render.to_yaml(render.render(spec, command, args.namespace, args.image, args.format))
    if args.output:
        parsing.write(args.output, manifests, "--output")
    else:
        sys.stdout.write(manifests)
    print(f"kdist: the pods read the job's secret from the Secret {security.secret_name(spec)}, "
          "which is not rendered (so renders are identical and hold no secret); create it once "
          f"in the namespace: {security.create_secret_command(spec, args.namespace)}",
          file=sys.stderr)
    return 0
