"""kdist's TCP ring against gloo at 2, 4 and 8 workers, each on a host of its own behind a shaped
link (network namespaces, `kdist.k8s.netlab`; root and iproute2).

    python benchmarks/ring_scaling.py [--workers 2,4,8] [--rate 1gbit] [--sizes 1,4,16]
                                      [--rounds 5]

Every worker is a process in a namespace of its own whose link `tc` shapes to `--rate` (a token
bucket; this machine's kernel has no netem, so no latency is added), all on one bridge: every byte a
worker sends crosses a link of that speed, as between machines. The workers sum float32 buffers of
each size (millions of elements) with kdist's ring (`kdist.exchange.ring.Ring`, the default gradient
sum on CPU workers) and with `torch.distributed.all_reduce` on gloo (PyTorch DDP's CPU path), taking
turns round after round; the table shows the medians over rounds (of the slowest worker, which the
step waits for) and the link bound: a ring moves 2 (N - 1) / N of the buffer through each worker's
link, which no all-reduce of whole buffers over these links beats. Saves
benchmarks/results/ring_scaling.{json,md}.

The machine has 2 cores: at 8 workers the processes share them, so figures there include waiting
for a core; both contenders share the same cores in turn.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_table  # noqa: E402


def worker(args):
    import numpy as np
    import torch
    import torch.distributed as dist

    from kdist.exchange.ring import Ring

    spec = json.loads(os.environ["TF_CONFIG"])
    addresses, rank = spec["cluster"]["worker"], spec["task"]["index"]
    store = args.store  # the rendezvous: a folder every namespace sees

    def publish(key, value):
        path = os.path.join(store, key.replace("/", "_"))
        with open(path + ".tmp", "w") as f:
            f.write(value)
        os.replace(path + ".tmp", path)

    def lookup(key):
        path = os.path.join(store, key.replace("/", "_"))
        while not os.path.exists(path):
            time.sleep(0.01)
        with open(path) as f:
            return f.read()

    ring = Ring.connect(rank, addresses, publish, lookup, timeout=300, generation=0,
                        secret=b"benchmark")
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"  # the namespace's shaped link (netlab), not lo
    host, _, port = addresses[0].rpartition(":")
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=len(addresses))
    buffers = {m: np.ones(int(m * 1e6), "float32") for m in args.sizes}
    tensors = {m: torch.ones(int(m * 1e6)) for m in args.sizes}
    methods = {}
    for m in args.sizes:
        methods[("kdist ring", m)] = lambda b=buffers[m]: ring.all_reduce_sum(b, in_place=True)
        methods[("gloo", m)] = lambda t=tensors[m]: dist.all_reduce(t)
    check = np.arange(1000, dtype="float32") * (rank + 1)
    exact = ring.all_reduce_sum(check)
    expected = np.arange(1000, dtype="float32") * sum(range(1, len(addresses) + 1))
    samples = {key: [] for key in methods}
    for _ in range(args.rounds):
        for key, method in methods.items():  # take turns: the same machine state for each
            dist.barrier()
            started = time.perf_counter()
            method()
            elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest worker's time
            samples[key].append(float(elapsed) * 1e3)
    dist.destroy_process_group()
    ring.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"samples": [[name, m, values] for (name, m), values in samples.items()],
                       "exact": bool(np.array_equal(exact, expected))}, f)


def run(args, workers: int) -> dict:
    """Runs one N-worker measurement in namespaces; returns rank 0's samples."""
    import measure

    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        out = os.path.join(folder, "result.json")
        store = os.path.join(folder, "store")
        os.mkdir(store)
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
                   "--store", store, "--sizes", ",".join(str(s) for s in args.sizes),
                   "--rounds", str(args.rounds)]
        hosts = [f"worker-{i}.ring" for i in range(workers)]
        return measure.run_on_shaped_link(hosts, args.rate, command, out, port=29500,
                                          timeout=1200)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="2,4,8")
    parser.add_argument("--rate", default="1gbit", help="each worker's link (tc units)")
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = [float(s) for s in args.sizes.split(",")]
    if args.worker:
        return worker(args)
    from kdist.k8s import netlab

    link = netlab.rate_bits(args.rate) / 8  # bytes per second
    rows = []
    for workers in (int(n) for n in args.workers.split(",")):
        data = run(args, workers)
        medians = {(name, m): statistics.median(values) for name, m, values in data["samples"]}
        for m in args.sizes:
            bound = 2 * (workers - 1) / workers * 4 * m * 1e6 / link * 1e3
            rows.append({"workers": workers, "elements_millions": m, "bound_ms": bound,
                         "kdist_ring_ms": medians[("kdist ring", m)],
                         "gloo_ms": medians[("gloo", m)], "exact": data["exact"]})
    lines = [f"Each worker behind its own {args.rate} link (network namespaces, tc tbf); median "
             f"of {args.rounds} rounds of the slowest worker's time.", "",
             "| workers | float32 elements | link bound | kdist ring | gloo | ring / gloo | "
             "ring / bound |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['workers']} | {row['elements_millions']:g}M | "
                     f"{row['bound_ms']:.1f} ms | {row['kdist_ring_ms']:.1f} ms | "
                     f"{row['gloo_ms']:.1f} ms | {row['kdist_ring_ms'] / row['gloo_ms']:.2f} | "
                     f"{row['kdist_ring_ms'] / row['bound_ms']:.2f} |")
    results_table.save("ring_scaling", "\n".join(lines), {"rows": rows, "args": vars(args)})


if __name__ == "__main__":
    main()
