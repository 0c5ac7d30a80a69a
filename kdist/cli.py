"""The `kdist` command line.

    kdist launch --workers 2 -- python train.py --epochs 3
    kdist launch --workers 2 --max-restarts 3 -- python train.py    (restart the group on failure)
    kdist launch --spec cluster_specs/local-2-workers.json -- python train.py
    kdist validate cluster_specs/local-ps.json
    kdist tf-config --spec cluster_specs/k8s-mwms.yaml --task worker:1 --namespace ml
    kdist tf-config --spec cluster_specs/k8s-ps.yaml --task ps:0 --host-pattern "{role}{index}.lab"
    kdist k8s render --spec cluster_specs/k8s-mwms.yaml --image REGISTRY/train:1 -- python train.py
    kdist k8s simulate --spec cluster_specs/k8s-mwms.yaml -- python train.py   (root: pods as hosts)
    kdist exec -- python train.py          (inside a pod rendered with --format jobs)
    kdist plan --model examples/plan_model.py:mlp --per-replica-batch 32 --replicas 8 --bandwidth 1Gbit
"""

from __future__ import annotations

import argparse
import sys

from kdist.cluster import ClusterSpec, ClusterSpecError

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kdist", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="verb", required=True)

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
    launch.add_argument("--private-network", action="store_true",
                        help="run the job in a new network namespace that has only a loopback "
                             "interface, so no other host can reach TensorFlow's unauthenticated "
                             "gRPC ports (which listen on every interface); tasks lose outside "
                             "network access (Linux; root or unprivileged user namespaces)")
    launch.add_argument("--max-restarts", type=int, default=0,
                        help="restart every task up to this many times when one fails (the "
                             "script sees KDIST_RESTART_COUNT; resume with BackupAndRestore)")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")

    validate = commands.add_parser("validate", help="check a cluster-spec file")
    validate.add_argument("spec")

    tf_config = commands.add_parser(
        "tf-config", help="print the TF_CONFIG of one task of a spec as deployed on Kubernetes "
                          "(or on hosts named by --host-pattern)")
    tf_config.add_argument("--spec", required=True)
    tf_config.add_argument("--task", required=True, help="TYPE:INDEX, e.g. worker:1")
    tf_config.add_argument("--namespace", default="default")
    tf_config.add_argument("--host-pattern", default=None,
                           help="host name of each task, with {job} (the spec's name), {role}, "
                                "{index} and {namespace}; default: the Kubernetes pod DNS name "
                                "{job}-{role}-{index}.{job}.{namespace}.svc")

    k8s = commands.add_parser("k8s", help="Kubernetes manifests")
    k8s_commands = k8s.add_subparsers(dest="k8s_command", required=True)
    render = k8s_commands.add_parser("render", help="write the manifests of a spec")
    render.add_argument("--spec", required=True)
    render.add_argument("--image", help="container image (default: the spec's image)")
    render.add_argument("--namespace", default="default")
    render.add_argument("--format", default="jobs", choices=["jobs", "tfjob"],
                        help="jobs: Indexed Jobs + headless Service (no operator); tfjob: Kubeflow")
    render.add_argument("--output", help="file to write (default: stdout)")
    render.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- program and arguments (default: the spec's command)")

    simulate = k8s_commands.add_parser(
        "simulate", help="run the pods of the rendered Indexed Jobs here, each in its own network "
                         "namespace resolving the Service DNS names (root, iproute2)")
    simulate.add_argument("--spec", required=True)
    simulate.add_argument("--namespace", default="default")
    simulate.add_argument("--timeout", type=float, default=None,
                          help="stop every pod after this many seconds (exit code 124)")
    simulate.add_argument("command", nargs=argparse.REMAINDER,
                          help="-- program and arguments (default: the spec's command)")

    plan = commands.add_parser(
        "plan", help="predict step time, throughput and scaling efficiency from t1 (measured "
                     "here) and t2 (gradient bytes over the network); recommend a batch size")
    plan.add_argument("--model", required=True,
                      help="module:function or file.py:function returning a Keras model")
    plan.add_argument("--per-replica-batch", type=int, required=True)
    plan.add_argument("--replicas", type=int, required=True)
    plan.add_argument("--bandwidth", required=True, help="link speed per worker, e.g. 1Gbit")
    plan.add_argument("--latency", default="0us", help="per-message latency, e.g. 50us")
    plan.add_argument("--compression", default="none",
                      help="none, fp16, bf16, powersgd:RANK or topk:RATIO")
    plan.add_argument("--overlap", action="store_true",
                      help="assume communication overlaps computation: max(t1, t2) instead of "
                           "t1 + t2 (what Keras on tf.distribute achieves)")
    plan.add_argument("--host-cost", default="auto",
                      help="CPU seconds per byte of the all-reduce's software path (copies, "
                           "serialization): 'auto' measures it with 2 workers on this machine's "
                           "loopback (~15 s); a number in ns per byte; 0 for an ideal host")
    plan.add_argument("--base-batch", type=int, default=None,
                      help="the batch your learning rate was tuned at (default: --per-replica-batch)")
    plan.add_argument("--plot", help="write a PNG of t1, t2 and step time against the batch")

    exec_ = commands.add_parser("exec", help="in a pod: set TF_CONFIG from JOB_COMPLETION_INDEX, "
                                             "then run the command")
    exec_.add_argument("command", nargs=argparse.REMAINDER)
    return parser


def _after_dashes(command: list[str]) -> list[str]:
    return command[1:] if command[:1] == ["--"] else command


def _task(text: str) -> tuple[str, int]:
    task_type, sep, index = text.partition(":")
    if not sep or not index.isdigit():
        raise ClusterSpecError("--task", f"{text!r} is not TYPE:INDEX", "write e.g. --task worker:1")
    return task_type, int(index)


def _launch_spec(args) -> ClusterSpec:
    from kdist.spec_file import load_spec

    if args.spec:
        if args.workers is not None or args.chief or args.ps or args.evaluator:
            raise ClusterSpecError("--spec", "given together with --workers/--chief/--ps/--evaluator",
                                   "describe the cluster either with --spec or with the role flags")
        from kdist.spec_file import KUBERNETES_ONLY, read_spec

        kubernetes_keys = [k for k in KUBERNETES_ONLY if k in read_spec(args.spec)]
        if kubernetes_keys:
            print(f"kdist: {', '.join(kubernetes_keys)} in {args.spec} apply to Kubernetes only; "
                  "this local launch runs the command after --", file=sys.stderr)
        return load_spec(args.spec)
    roles = {"chief": int(args.chief), "worker": 2 if args.workers is None else args.workers,
             "ps": args.ps, "evaluator": int(args.evaluator)}
    return ClusterSpec.local_layout({job: n for job, n in roles.items() if n}, source="kdist launch")


def _plan(args) -> int:
    from kdist import planner

    bandwidth, latency = planner.parse_bandwidth(args.bandwidth), planner.parse_latency(args.latency)
    compressor = planner.parse_compression(args.compression)
    model_fn = planner.load_model_function(args.model)
    if args.host_cost == "auto":
        host_cost = planner.measure_host_cost(planner.gradient_bytes(model_fn()))
    else:
        try:
            host_cost = float(args.host_cost) * 1e-9
        except ValueError:
            raise ValueError(f"--host-cost={args.host_cost!r}: use auto or ns per byte") from None
    result = planner.plan(model_fn, args.per_replica_batch, args.replicas, bandwidth, latency,
                          compressor, overlap=args.overlap, host_cost=host_cost)
    print(f"step = {'max(t1, t2)' if args.overlap else 't1 + t2'}; bandwidth {args.bandwidth}, "
          f"latency {args.latency}, host cost {host_cost * 1e9:.2f} ns/byte, compression "
          f"{args.compression}")
    print(result.table())
    if result.recommended is None:
        print("no measured batch makes t1 >= t2: communication dominates; use compression, a "
              "faster network or fewer replicas")
    else:
        print(f"recommended: per-replica batch {result.recommended.per_replica_batch} (smallest "
              f"with t1 >= t2); {result.learning_rate_advice(args.base_batch or args.per_replica_batch)}")
    if args.plot:
        planner.plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.verb == "validate":
            from kdist.spec_file import load_spec

            spec = load_spec(args.spec)
            print(f"{args.spec}: valid; " + ", ".join(f"{n} {job}" for job, n in spec.roles.items()))
            return 0
        if args.verb in ("tf-config", "k8s"):
            from kdist import k8s
            from kdist.spec_file import read_k8s_spec

            spec = read_k8s_spec(args.spec)
            if args.verb == "tf-config":
                cluster = k8s.kubernetes_cluster(spec, args.namespace,
                                                 args.host_pattern or k8s.HOST_PATTERN)
                print(cluster.tf_config_json(*_task(args.task)))
                return 0
            if args.k8s_command == "simulate":
                from kdist.k8s_simulate import simulate

                return simulate(spec, _after_dashes(args.command), args.namespace, args.timeout)
            manifests = k8s.to_yaml(k8s.render(spec, _after_dashes(args.command), args.namespace,
                                               args.image, args.format))
            if args.output:
                with open(args.output, "w", encoding="utf-8") as f:
                    f.write(manifests)
            else:
                sys.stdout.write(manifests)
            return 0
        if args.verb == "plan":
            return _plan(args)
        if args.verb == "exec":
            from kdist import k8s

            k8s.exec_with_tf_config(_after_dashes(args.command))  # does not return
        if args.private_network:
            from kdist.private_network import enter_private_network

            enter_private_network()
        from kdist.launcher import Launcher

        launcher = Launcher(_launch_spec(args), _after_dashes(args.command), timeout=args.timeout,
                            grace=args.grace, max_restarts=args.max_restarts)
    except (ClusterSpecError, ValueError) as err:
        print(f"kdist: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
