"""Gradient all-reduce between 2 CPU workers: TensorFlow's collectives, kdist's TCP ring, gloo.

    python benchmarks/collectives.py [--sizes 1,4,16] [--rounds 15] [--profile]

Two worker processes on 127.0.0.1 (each pinned to one core, one TensorFlow thread, as
`benchmarks/peers.py` trains them) sum float32 tensors of each size (millions of elements):

- `tensorflow`: MultiWorkerMirroredStrategy's all-reduce (its ring over gRPC), in a tf.function;
- `kdist tcp`: the same strategy built with ``all_reduce="tcp"``: kdist's ring over TCP, called
  from the tf.function as a gradient exchange calls it (`kdist.exchange.Comm`);
- `gloo`: `torch.distributed.all_reduce` with the gloo backend (PyTorch DDP's CPU path), when
  PyTorch is installed;
- `socket bound`: the ring's bytes, 2 (N - 1) / N x 4 n per worker, at the rate two plain sockets
  move them while sending and receiving at once, measured here: no implementation can beat it.

Methods take turns within each round; the table shows medians and each method's ratio to gloo
and to the bound. With `--profile`, TensorFlow's all-reduce of the largest size is traced with
TensorFlow's profiler and the host events that take its time are listed (where the gRPC path spends
it). Saves benchmarks/results/collectives.{json,md}.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import results_table  # noqa: E402


def worker(args):
    measure.pin_worker_to_one_core()
    measure.one_thread()  # before TensorFlow starts (kdist.strategy starts it)
    import kdist

    strategy = kdist.strategy(all_reduce="auto")
    import numpy as np
    import tensorflow as tf

    from kdist.exchange.comm import _LazyRing
    from kdist.keras_seam import tf_internals

    spec = kdist.cluster()
    rank = spec.task_index
    addresses = [spec.address("worker", i) for i in range(2)]
    ring = _LazyRing(rank, addresses, timeout=120, names=addresses)
    methods = {}
    tensors = {}
    for millions in args.sizes:
        n = int(millions * 1e6)
        tensors[millions] = tf.constant(np.random.default_rng(rank).normal(size=n)
                                        .astype("float32"))

    def tf_sum_of(values):
        """TensorFlow's all-reduce of `values`, as a traced function returning this worker's sum."""
        all_reduce = tf.function(lambda: strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("SUM", values)))
        return lambda: strategy.experimental_local_results(all_reduce())[0].numpy()

    def ring_sum_of(values):
        all_reduce = tf.function(lambda: tf.numpy_function(ring.all_reduce_sums, [values],
                                                           [tf.float32], stateful=True))
        return lambda: all_reduce()[0].numpy()

    tf_sums = {m: tf_sum_of(v) for m, v in tensors.items()}
    ring_sums = {m: ring_sum_of(v) for m, v in tensors.items()}
    for millions in tensors:
        methods[("tensorflow", millions)] = tf_sums[millions]
        methods[("kdist tcp", millions)] = ring_sums[millions]
    gloo = _gloo(rank, addresses, tf_internals)
    if gloo is not None:
        for millions, values in tensors.items():
            buffer = gloo.from_numpy(values.numpy().copy())
            methods[("gloo", millions)] = lambda b=buffer: gloo.distributed.all_reduce(b)
    bound = _socket_bound(ring, args.sizes)
    # Exactness: every method sums to the same numbers.
    exact = {}
    for millions in tensors:
        exact[millions] = float(np.abs(ring_sums[millions]() - tf_sums[millions]()).max())
    samples = {key: [] for key in methods}
    for _ in range(args.rounds):
        for key, function in methods.items():  # take turns: the same machine state for each
            samples[key].append(measure.median_seconds(function, 1) * 1e3)
    profile = _profile(tf_sums[max(args.sizes)], args) if args.profile else None
    if rank == 0:
        rows = []
        for millions in args.sizes:
            row = {"elements_millions": millions, "bound_ms": bound[millions],
                   "max_difference_tcp_vs_tensorflow": exact[millions]}
            for name in ("tensorflow", "kdist tcp", "gloo"):
                if (name, millions) in samples:
                    row[name] = statistics.median(samples[(name, millions)])
            rows.append(row)
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "profile": profile, "rounds": args.rounds}, f)


def _gloo(rank, addresses, tf_internals):
    try:
        import torch
        import torch.distributed
    except ImportError:
        return None
    import portpicker

    torch.set_num_threads(1)
    host = addresses[0].rpartition(":")[0]
    if rank == 0:
        tf_internals.set_job_key("bench/gloo", str(portpicker.pick_unused_port()))
    port = tf_internals.get_job_key("bench/gloo")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                                         world_size=len(addresses))
    return torch


def _socket_bound(ring, sizes) -> dict:
    """Milliseconds two plain sockets take to move each size's ring bytes, sending and receiving
    at once (the ring's own connections, without its adds or copies)."""
    import numpy as np

    ring.all_reduce_sums(np.zeros(8, "float32"))  # connects
    connected = ring._ring
    bound = {}
    for millions in sizes:
        half = np.ones(int(millions * 1e6) // 2, "float32")  # 2 (N - 1) / N of n, N = 2
        received = np.ones_like(half)  # real pages, as a gradient's
        times = []
        for _ in range(5):
            started = time.perf_counter()
            connected._exchange(half, received)
            connected._exchange(half, received)
            times.append(time.perf_counter() - started)
        bound[millions] = min(times) * 1e3
    return bound


def _profile(tf_sum, args) -> list:
    """TensorFlow's profiler on a few all-reduces (every worker traces: the collective needs
    both): the host events that take the time."""
    import glob

    import tensorflow as tf

    logdir = os.path.join(os.path.dirname(args.out), f"profile-{os.getpid()}")
    tf.profiler.experimental.start(logdir)
    for _ in range(3):
        tf_sum()
    tf.profiler.experimental.stop()
    planes = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not planes:
        return []
    space = _xplane_module().XSpace()
    with open(planes[0], "rb") as f:
        space.ParseFromString(f.read())
    totals = {}
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:  # nested events overlap: each is a share of the whole
                name = names.get(event.metadata_id, "?")
                totals[name] = totals.get(name, 0.0) + event.duration_ps / 1e9 / 3  # ms per call
    return sorted(([name, ms] for name, ms in totals.items()), key=lambda e: -e[1])[:20]


def _xplane_module():
    """TensorFlow's profiler trace proto (XSpace), wherever this TensorFlow keeps it."""
    import importlib

    for name in ("tensorflow.tsl.profiler.protobuf.xplane_pb2",
                 "tsl.profiler.protobuf.xplane_pb2", "xla.tsl.profiler.protobuf.xplane_pb2"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("no xplane_pb2 in this TensorFlow")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = [float(s) for s in args.sizes.split(",")]
    if args.worker:
        return worker(args)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "collectives.json")
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
                   "--sizes", ",".join(str(s) for s in args.sizes), "--rounds", str(args.rounds)]
        if args.profile:
            command.append("--profile")
        data = measure.local_job(command, 2, out, "collectives", timeout=1800)
    lines = ["| float32 elements | socket bound | TensorFlow | kdist tcp | gloo | TF / gloo | "
             "kdist / gloo | kdist / bound | TF / bound |", "|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        gloo = row.get("gloo")

        def ratio(a, b):
            return f"{a / b:.2f}" if a and b else "n/a"

        lines.append(f"| {row['elements_millions']:g}M | {row['bound_ms']:.2f} ms | "
                     f"{row['tensorflow']:.2f} ms | {row['kdist tcp']:.2f} ms | "
                     f"{f'{gloo:.2f} ms' if gloo else 'n/a'} | {ratio(row['tensorflow'], gloo)} | "
                     f"{ratio(row['kdist tcp'], gloo)} | {ratio(row['kdist tcp'], row['bound_ms'])}"
                     f" | {ratio(row['tensorflow'], row['bound_ms'])} |")
    if data["profile"]:
        lines += ["", f"TensorFlow's all-reduce of {max(args.sizes):g}M elements, host events "
                      "(ms per all-reduce):", "", "| event | ms |", "|---|---|"]
        lines += [f"| `{name}` | {ms:.2f} |" for name, ms in data["profile"]]
    results_table.save("collectives", "\n".join(lines), data)


if __name__ == "__main__":
    main()
