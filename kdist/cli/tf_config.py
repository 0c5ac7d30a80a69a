"""`kdist tf-config`: the TF_CONFIG of one task of a spec."""

from __future__ import annotations

import sys

from kdist.cli import parsing
from kdist.cluster.spec import ClusterSpecError

# Imported inside functions: spec files and the Kubernetes renderer, which `kdist --help` must not
# load.


def add(commands) -> None:
    tf_config = commands.add_parser(
        "tf-config", help="print the TF_CONFIG of one task of a spec: its fixed addresses, or "
                          "as deployed on Kubernetes (or on hosts named by --host-pattern)")
    tf_config.set_defaults(run=run)
    tf_config.add_argument("--spec", required=True, help="cluster-spec file")
    tf_config.add_argument("--task", required=True, help="TYPE:INDEX, e.g. worker:1")
    tf_config.add_argument("--namespace", type=parsing.namespace, default=None,
                           help="the Kubernetes namespace of a roles spec (default: default)")
    tf_config.add_argument("--host-pattern", default=None,
                           help="host name of each task, with {job} (the spec's name), {role}, "
                                "{index} and {namespace}; default: the Kubernetes pod DNS name "
                                "{job}-{role}-{index}.{job}.{namespace}.svc")


def run(args) -> int:
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
        if args.host_pattern is None:
            print(f"kdist: {args.spec} lists roles, not addresses: these are the pods' names as "
                  "`kdist k8s render` deploys them; on other machines pass --host-pattern, and "
                  f"on this one run `kdist launch --spec {args.spec} -- python train.py`",
                  file=sys.stderr)
        cluster = render.kubernetes_cluster(spec, args.namespace or "default",
                                            args.host_pattern or render.HOST_PATTERN)
    print(cluster.tf_config_json(*parsing.task(args.task)))
    return 0
