"""`kdist plan`: step time, throughput and scaling efficiency from t1 and t2 (`kdist.planner`)."""

from __future__ import annotations

import sys

from kdist.cli import parsing
from kdist.compression import registry

# Imported inside functions: kdist.planner, which `kdist --help` must not load (its measuring
# imports TensorFlow).


def add(commands) -> None:
    plan = commands.add_parser(
        "plan", help="predict step time, throughput and scaling efficiency from t1 (compute, "
                     "measured here) and t2 (communication: gradient bytes over the network); "
                     "recommend a batch size",
        description="Measures t1 (compute) of your model here at a few batch sizes, models t2 "
                    "(communication) for the cluster you describe, and recommends a batch.",
        epilog="example: kdist plan --model examples/plan_model.py:mlp --per-replica-batch 64 "
               "--replicas 8 --bandwidth 10Gbit --host-cost 0")
    plan.set_defaults(run=run)
    plan.add_argument("--model", required=True,
                      help="module:function or file.py:function returning a Keras model")
    plan.add_argument("--per-replica-batch", type=parsing.positive_count, required=True,
                      help="the batch per replica you train with now (the plan measures from a "
                           "few below it to a few above)")
    plan.add_argument("--replicas", type=parsing.positive_count, required=True,
                      help="replicas in the cluster you plan for (workers x devices per worker)")
    plan.add_argument("--bandwidth", required=True,
                      help="link speed per worker: 1Gbit, 1Gbps, 10Gb/s, 10G (bits) or 125MB/s "
                           "(bytes)")
    plan.add_argument("--latency", default="0us", help="per-message latency, e.g. 50us")
    plan.add_argument("--compression", default="none", help=registry.spelled())
    plan.add_argument("--overlap", action="store_true",
                      help="assume communication overlaps computation: max(t1, t2) instead of "
                           "t1 + t2 (what Keras on tf.distribute achieves; kdist.scope("
                           "bucket_bytes=...) measured in between, see docs/overlap.md)")
    plan.add_argument("--host-cost", default="auto",
                      help="CPU seconds per byte of the all-reduce's software path (copies, "
                           "serialization): 'auto' measures it with 2 workers on this machine's "
                           "loopback (~15 s); a number in ns per byte; 0 for an ideal host")
    plan.add_argument("--base-batch", type=parsing.positive_count, default=None,
                      help="the batch your learning rate was tuned at (default: --per-replica-batch)")
    plan.add_argument("--max-global-batch", type=parsing.positive_count, default=None,
                      help="the largest global batch your model still converges at (the "
                           "recommendation stays at or below it)")
    plan.add_argument("--plot", help="write a PNG of t1, t2 and step time against the batch")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args) -> int:
    import json

    from kdist import planner
    from kdist.doctor import without_tf_logs

    # The flags first, before TensorFlow starts (seconds): a mistyped one is named at once.
    parsing.output_file(args.plot, "--plot")
    bandwidth, latency = planner.parse_bandwidth(args.bandwidth), planner.parse_latency(args.latency)
    host_cost = planner.parse_host_cost(args.host_cost)
    with without_tf_logs(enabled=True):  # TensorFlow's C++ banner is not the plan's
        compressor = planner.parse_compression(args.compression)  # a compressor imports TF
        model_fn = planner.load_model_function(args.model)
        import tensorflow as tf

        tf.config.list_logical_devices()  # the runtime starts (and logs) here

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
    if result.compression is not None:
        print(f"compression: {result.compression_verdict()}")
    for warning in result.warnings():
        print(f"warning: {warning}")
    print(f"recommended: {result.reason()}")
    print(result.learning_rate_advice(base_batch))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
