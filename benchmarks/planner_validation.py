"""`kdist plan` against measurement: 2 MWMS workers as two hosts on links shaped by tc.

    sudo python benchmarks/planner_validation.py [--rates 100mbit,1gbit,10gbit] [--batch 64]

(needs root and iproute2; `pip install -e ".[bench]"` for the plot). For each link rate, a
`kdist.k8s.netlab.Network` gives each worker its own network namespace whose link is shaped with
`tc tbf`; both train examples/plan_model.py's MLP (4.5 MB of gradients) with kdist.scope() + fit,
and the chief records the median step time. The planner's prediction uses t1 measured here the
same way the workers compute (one CPU thread each: this machine has 2 cores for 2 workers) and t2
from the gradient bytes over the link plus the host's per-byte cost of an all-reduce, measured on
the unshaped loopback (`kdist.planner.measure_host_cost`). Prints predicted (t1 + t2 and max(t1, t2)) against measured
and saves benchmarks/results/planner_validation.{json,md,png}.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import measure
import results_table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
HOSTS = ["worker-0.plan.test", "worker-1.plan.test"]
PORT = 2222


def job(out_path, batch, steps):
    """Runs on each worker, in its namespace."""
    import kdist

    measure.one_thread()  # configuration, not an op: allowed before MWMS
    kdist.strategy()
    import numpy as np

    import plan_model

    with kdist.scope():
        model = plan_model.mlp()
    timed = measure.warm_step_times(model, kdist.global_batch_size(batch), steps)
    if kdist.cluster().is_chief:
        with open(out_path, "w") as f:
            json.dump({"median_step": float(np.median(timed)), "steps": len(timed)}, f)


def measure_t1(batch):
    """In a fresh process: t1 with one CPU thread, as each worker computes."""
    measure.one_thread()
    import plan_model

    from kdist import planner

    print(json.dumps({"t1": planner.measure_compute_time(plan_model.mlp, batch)}))


def shaped_run(rate, out_path, args):
    command = [sys.executable, os.path.abspath(__file__), "--job-out", out_path,
               "--batch", str(args.batch), "--steps", str(args.steps)]
    return measure.run_on_shaped_link(HOSTS, rate, command, out_path, PORT, args.timeout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="100mbit,1gbit,10gbit")
    parser.add_argument("--batch", type=int, default=64, help="per-replica batch")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (2 epochs)")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    parser.add_argument("--measure-t1", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job_out:
        return job(args.job_out, args.batch, args.steps)
    if args.measure_t1:
        return measure_t1(args.batch)

    from kdist import planner
    from kdist.k8s import netlab

    import plan_model

    measured_t1 = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure-t1",
                                  "--batch", str(args.batch)], capture_output=True, text=True,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), check=True)
    t1 = json.loads(measured_t1.stdout.strip().splitlines()[-1])["t1"]
    payload, collective = planner.gradient_bytes(plan_model.mlp()), "all_reduce"
    host_cost = planner.measure_host_cost(payload)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for rate in args.rates.split(","):
            t2 = planner.communication_time(payload, collective, 2, netlab.rate_bits(rate), 0.0,
                                            host_cost)
            measured = shaped_run(rate, os.path.join(scratch, f"{rate}.json"), args)["median_step"]
            sequential = planner.estimate(args.batch, t1, t2, 2, overlap=False).step
            overlapped = planner.estimate(args.batch, t1, t2, 2, overlap=True).step
            rows.append({"rate": rate, "t1": t1, "t2": t2, "predicted_sum": sequential,
                         "predicted_max": overlapped, "measured": measured,
                         "error_sum": sequential / measured - 1,
                         "error_max": overlapped / measured - 1})
            print(f"{rate}: measured {measured * 1e3:.1f} ms", flush=True)
    lines = [f"Predicted vs measured step time: 2 MWMS workers in network namespaces, links shaped "
             f"by tc tbf, MLP 64-1024-1024-10 ({payload / 1e6:.2f} MB of gradients), per-replica "
             f"batch {args.batch}, one CPU thread per worker, {os.cpu_count()} cores; host cost "
             f"{host_cost * 1e9:.2f} ns/byte (kdist.planner.measure_host_cost).", "",
             "| link | t1 | t2 | predicted t1 + t2 | error | predicted max(t1, t2) | error "
             "| measured |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rate']} | {r['t1'] * 1e3:.1f} ms | {r['t2'] * 1e3:.1f} ms | "
                     f"{r['predicted_sum'] * 1e3:.1f} ms | {r['error_sum']:+.0%} | "
                     f"{r['predicted_max'] * 1e3:.1f} ms | {r['error_max']:+.0%} | "
                     f"{r['measured'] * 1e3:.1f} ms |")
    folder = results_table.save("planner_validation", "\n".join(lines), rows)
    plot(rows, os.path.join(folder, "planner_validation.png"))


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    labels = [r["rate"] for r in rows]
    axis.plot(labels, [r["measured"] * 1e3 for r in rows], "o-", label="measured")
    axis.plot(labels, [r["predicted_sum"] * 1e3 for r in rows], "s--", label="predicted t1 + t2")
    axis.plot(labels, [r["predicted_max"] * 1e3 for r in rows], "^:", label="predicted max(t1, t2)")
    axis.set_yscale("log")
    axis.set_xlabel("link")
    axis.set_ylabel("step time (ms)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
