"""Bytes on the wire per step against the ring all-reduce lower bound 2(n-1)/n x gradient bytes.

    sudo python benchmarks/wire.py [--mtus 9000,1500] [--width 1024] [--steps 30]

(needs root and iproute2). Two MWMS workers run as two hosts of a `kdist.k8s.netlab.Network` (each in
its own network namespace, on its own link). Each worker counts the bytes its link sent during a
warm epoch of kdist.scope() + fit (Ethernet, IP and TCP headers included: everything that crosses
the wire), divided by the steps. The lower bound for a ring all-reduce of G bytes of float32
gradients among n workers is 2(n-1)/n x G per worker. Prints the ratio (goal <= 1.02 uncompressed)
for each MTU and saves benchmarks/results/wire.{json,md}.
"""

import argparse
import json
import os
import sys
import tempfile

import measure
import results_table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
HOSTS = ["worker-0.wire.test", "worker-1.wire.test"]


def job(out_path, width, steps, batch):
    import kdist

    kdist.strategy()
    import keras
    import numpy as np

    import plan_model

    with kdist.scope():
        model = plan_model.mlp(width)
    global_batch = kdist.global_batch_size(batch)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch * steps, 64)).astype("float32")
    y = rng.integers(0, 10, size=(global_batch * steps,))
    counted = {}

    class Counter(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            counted[epoch] = -measure.interface_bytes("eth0", "tx")

        def on_epoch_end(self, epoch, logs=None):
            counted[epoch] += measure.interface_bytes("eth0", "tx")

    model.fit(x, y, batch_size=global_batch, epochs=2, verbose=0, shuffle=False,
              callbacks=[Counter()])
    gradient_bytes = sum(4 * int(np.prod(v.shape)) for v in model.trainable_variables)
    with open(f"{out_path}.{kdist.cluster().task_index}", "w") as f:
        json.dump({"bytes_per_step": counted[1] / steps, "gradient_bytes": gradient_bytes}, f)


def run(mtu, out_path, args):
    from kdist.k8s import netlab

    with netlab.Network(HOSTS, mtu=mtu) as network:
        network.run_workers([sys.executable, os.path.abspath(__file__), "--job-out", out_path,
                             "--width", str(args.width), "--steps", str(args.steps), "--batch",
                             str(args.batch)], 2222, args.timeout)
    workers = []
    for i in range(len(HOSTS)):
        with open(f"{out_path}.{i}") as f:
            workers.append(json.load(f))
    return workers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mtus", default="9000,1500")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32, help="per-replica batch")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job_out:
        return job(args.job_out, args.width, args.steps, args.batch)

    n = len(HOSTS)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mtu in args.mtus.split(","):
            results[mtu] = run(int(mtu), os.path.join(scratch, f"mtu{mtu}"), args)
    lines = [f"Bytes each MWMS worker sends per step (Ethernet+IP+TCP headers included) vs the ring "
             f"all-reduce lower bound 2(n-1)/n x gradient bytes, n = {n}, MLP "
             f"64-{args.width}-{args.width}-10, uncompressed float32 gradients.", "",
             "| MTU | worker | gradient bytes | lower bound | sent per step | ratio (goal <= 1.02) |",
             "|---|---|---|---|---|---|"]
    for mtu, workers in results.items():
        for i, worker in enumerate(workers):
            bound = 2 * (n - 1) / n * worker["gradient_bytes"]
            worker["lower_bound"], worker["ratio"] = bound, worker["bytes_per_step"] / bound
            lines.append(f"| {mtu} | {i} | {worker['gradient_bytes']:,} | {bound:,.0f} | "
                         f"{worker['bytes_per_step']:,.0f} | {worker['ratio']:.4f} |")
    results_table.save("wire", "\n".join(lines), results)


if __name__ == "__main__":
    sys.exit(main())
