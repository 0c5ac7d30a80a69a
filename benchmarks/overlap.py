"""Overlap of gradient communication with backprop: `bucket_bytes` against Keras's one batch.

    sudo python benchmarks/overlap.py [--rates 100mbit,1gbit,2gbit,10gbit] [--batch 1024]
                                      [--bucket-mb 1] [--rounds 3] [--inter-op 1]

(needs root and iproute2). 2 MultiWorkerMirrored workers, each in a network namespace of its own
whose link is shaped with `tc tbf` (`kdist.k8s.netlab`), one CPU thread each, train a deep MLP
(64 -> 8 x 512 -> 10, SGD): Keras's all-reduce (one batch, packed first layer first) and
`kdist.scope(bucket_bytes=...)` (buckets, last layer first), taking turns `--rounds` times per link.
t1 is measured in a fresh process on one core, as each worker computes; t2 is measured on
each link by the same 2 workers running Keras's gradient all-reduce alone (one batch of the
model's gradient shapes, no compute), next to `kdist plan`'s model of it (bytes over the rate plus
the host's per-byte cost). Prints measured step times against t1 + t2 and max(t1, t2) and saves
benchmarks/results/overlap.{json,md} (with `--inter-op N`: overlap_inter_op_N, N ops may run side
by side, e.g. a collective's ring steps next to a backward matmul; with another `--batch B`:
overlap_batch_B).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import measure
import results_table

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS = ["worker-0.overlap.test", "worker-1.overlap.test"]
PORT = 2222
DEPTH, WIDTH = 8, 512


def deep_mlp():
    import keras

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(WIDTH, activation="relu") for _ in range(DEPTH)]
    model = keras.Sequential([keras.Input((64,)), *layers, keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def job(out_path, batch, steps, bucket_bytes, inter_op, all_reduce_only):
    """Runs on each worker, in its namespace: trains, or times the all-reduce alone."""
    import kdist

    measure.one_thread(inter_op)  # configuration, not an op: allowed before MWMS
    strategy = kdist.strategy()
    import numpy as np

    with kdist.scope(bucket_bytes=bucket_bytes or None):
        model = deep_mlp()
    timed = all_reduce_step_times(strategy, model, 2 * steps) if all_reduce_only else \
        measure.warm_step_times(model, kdist.global_batch_size(batch), steps)
    if kdist.cluster().is_chief:
        with open(out_path, "w") as f:
            json.dump({"median_step": float(np.median(timed)), "steps": timed}, f)


def all_reduce_step_times(strategy, model, steps) -> list[float]:
    """t2 measured: Keras's gradient all-reduce (one batch of the model's gradient shapes, as
    `_all_reduce_sum_gradients` sends them) with no compute, timed per step after 3 warm ones."""
    import tensorflow as tf

    shapes = [v.shape for v in model.trainable_variables]

    @tf.function
    def step():
        def reduce():
            summed = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, [tf.ones(shape) for shape in shapes])
            return tf.add_n([tf.reduce_sum(t) for t in summed])

        return strategy.run(reduce)

    times = []
    for _ in range(steps + 3):
        start = time.perf_counter()
        float(step())
        times.append(time.perf_counter() - start)
    return times[3:]


def measure_t1(batch, inter_op):
    """On one core, as each of the 2 workers has one: with `inter_op` 2 a lone process would
    otherwise run a layer's two backward matmuls on both cores, which the workers cannot."""
    os.sched_setaffinity(0, {0})
    measure.one_thread(inter_op)
    from kdist import planner

    print(json.dumps({"t1": planner.measure_compute_time(deep_mlp, batch)}))


def shaped_run(rate, bucket_bytes, args, scratch, all_reduce_only=False):
    out = os.path.join(scratch, f"{rate}-{bucket_bytes}.json")
    command = [sys.executable, os.path.abspath(__file__), "--job-out", out, "--batch",
               str(args.batch), "--steps", str(args.steps), "--bucket-bytes", str(bucket_bytes),
               "--inter-op", str(args.inter_op)] + (["--all-reduce-only"] if all_reduce_only else [])
    return measure.run_on_shaped_link(HOSTS, rate, command, out, PORT, args.timeout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="100mbit,1gbit,2gbit,10gbit")
    parser.add_argument("--batch", type=int, default=1024, help="per-replica batch")
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=10, help="steps per epoch (2 epochs)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inter-op", type=int, default=1, help="inter-op threads per worker")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    parser.add_argument("--bucket-bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--measure-t1", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--all-reduce-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job_out:
        return job(args.job_out, args.batch, args.steps, args.bucket_bytes, args.inter_op,
                   args.all_reduce_only)
    if args.measure_t1:
        return measure_t1(args.batch, args.inter_op)

    from kdist import planner
    from kdist.k8s import netlab

    measured_t1 = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure-t1",
                                  "--batch", str(args.batch), "--inter-op", str(args.inter_op)],
                                 capture_output=True, text=True,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), check=True)
    t1 = json.loads(measured_t1.stdout.strip().splitlines()[-1])["t1"]
    payload, collective = planner.gradient_bytes(deep_mlp()), "all_reduce"
    host_cost = planner.measure_host_cost(payload)
    bucket_bytes = int(args.bucket_mb * 2**20)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for rate in args.rates.split(","):
            modelled = planner.communication_time(payload, collective, 2, netlab.rate_bits(rate),
                                                  0.0, host_cost)
            t2 = statistics.median(shaped_run(rate, 0, args, scratch, all_reduce_only=True)["steps"])
            print(f"{rate} t2 measured {t2 * 1e3:.1f} ms, modelled {modelled * 1e3:.1f} ms",
                  flush=True)
            runs = {"keras": [], "buckets": []}  # name -> one list of step times per round
            for _ in range(args.rounds):
                for name, size in (("keras", 0), ("buckets", bucket_bytes)):
                    runs[name].append(shaped_run(rate, size, args, scratch)["steps"])
                    print(f"{rate} {name}: {statistics.median(runs[name][-1]) * 1e3:.1f} ms",
                          flush=True)
            keras_ms, buckets_ms = (_pooled_median(runs[n]) for n in ("keras", "buckets"))
            low, high = _bootstrap_speedup(runs, args.rounds)
            rows.append({"rate": rate, "t1": t1, "t2": t2, "t2_model": modelled, "keras": keras_ms,
                         "buckets": buckets_ms, "ratio_to_max": buckets_ms / max(t1, t2),
                         "speedup": keras_ms / buckets_ms, "speedup_interval": [low, high],
                         "steps": runs})
    lines = [f"2 MWMS workers in network namespaces, links shaped by tc tbf, MLP 64-{DEPTH}x{WIDTH}"
             f"-10 ({payload / 1e6:.2f} MB of gradients), per-replica batch {args.batch}, one CPU "
             f"thread for the math and {args.inter_op} to run ops per worker, {os.cpu_count()} "
             f"cores (t1 measured alone on one of them); buckets of {args.bucket_mb:g} MB; median "
             f"step of {args.rounds} runs each, taking turns (interval: bootstrap over the runs); "
             "t2 measured: the same workers' gradient all-reduce alone on that link (median of "
             f"{2 * args.steps}); t2 model: `kdist plan`'s (host cost {host_cost * 1e9:.2f} "
             "ns/byte).", "",
             "| link | t1 | t2 model | t2 | t1 + t2 | max(t1, t2) | Keras (one batch) | buckets | "
             "buckets / max(t1, t2) | Keras / buckets | 95% interval |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rate']} | {r['t1'] * 1e3:.1f} ms | {r['t2_model'] * 1e3:.1f} ms | "
                     f"{r['t2'] * 1e3:.1f} ms | "
                     f"{(r['t1'] + r['t2']) * 1e3:.1f} ms | {max(r['t1'], r['t2']) * 1e3:.1f} ms | "
                     f"{r['keras'] * 1e3:.1f} ms | {r['buckets'] * 1e3:.1f} ms | "
                     f"{r['ratio_to_max']:.2f} | {r['speedup']:.2f} | "
                     f"{r['speedup_interval'][0]:.2f}-{r['speedup_interval'][1]:.2f} |")
    name = "overlap" + (f"_inter_op_{args.inter_op}" if args.inter_op != 1 else "") + \
        (f"_batch_{args.batch}" if args.batch != 1024 else "")
    results_table.save(name, "\n".join(lines), rows)


def _pooled_median(rounds: list[list[float]]) -> float:
    return statistics.median([step for steps in rounds for step in steps])


def _bootstrap_speedup(runs: dict, rounds: int) -> tuple[float, float]:
    """95% interval of Keras / buckets (pooled medians), resampling whole runs (rounds)."""
    import numpy as np

    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(2000):
        pick = rng.integers(0, rounds, size=rounds)
        ratios.append(_pooled_median([runs["keras"][i] for i in pick]) /
                      _pooled_median([runs["buckets"][i] for i in pick]))
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


if __name__ == "__main__":
    main()
