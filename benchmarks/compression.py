"""Gradient compression on emulated links: bytes per step and time to a target accuracy.

    sudo python benchmarks/compression.py [--rates 1gbit,100mbit] [--exchanges auto,ring]
                                          [--rounds 3] [--target 0.95] [--max-epochs 30]

(needs root, iproute2 and `pip install -e ".[bench]"` for the plot). For each link rate, a fresh
network namespace is made, its loopback shaped with `tc qdisc ... tbf rate RATE`, and 2
MultiWorkerMirrored workers are launched inside it with `kdist launch`. Each worker trains an MLP
64-1024-1024-10 on the UCI digits with every compressor from the same initial weights, stopping
when the test accuracy reaches --target; the chief records wall time to target and loopback
bytes per step. Each link runs every compressor under each exchange, taking turns: kdist's
default (``all_reduce="auto"``: its TCP ring on CPU workers) and TensorFlow's collectives
(``all_reduce="ring"``), so the table compares them side by side; the whole is repeated
--rounds times and the table shows medians. Prints a table and saves
benchmarks/results/compression.{json,md,png}. Only the namespaces it creates are touched, and
they are deleted afterwards.
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
ROOT = os.path.dirname(HERE)
NAMES = ("none", "fp16", "powersgd_r4", "topk_1pct")


EXCHANGES = {"auto": "kdist default (TCP ring)", "ring": "TF collectives"}


def job(out_path, target, max_epochs, all_reduce):
    """Runs on both workers inside the shaped namespace."""
    import kdist

    kdist.strategy(all_reduce=all_reduce)
    import keras

    from kdist import compression

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import mnist_data

    digits = mnist_data.load("digits")
    x, x_test = digits.x_train.reshape(-1, 64), digits.x_test.reshape(-1, 64)
    makers = {"none": lambda: None, "fp16": lambda: compression.from_name("fp16"),
              "powersgd_r4": lambda: compression.from_name("powersgd:4"),
              "topk_1pct": lambda: compression.from_name(
                  "topk:0.01", momentum=0.9, warmup=(0.0625,), warmup_steps=-(-len(x) // batch),
                  values="float16")}  # one warm-up epoch at 6.25% (each stage is traced anew)
    batch = kdist.global_batch_size(32)
    rows = {}
    for name in NAMES:
        compressor = makers[name]()
        keras.utils.set_random_seed(0)
        with kdist.scope(compression=compressor):
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024, activation="relu"),
                                      keras.layers.Dense(1024, activation="relu"),
                                      keras.layers.Dense(10)])
            momentum = 0.0 if getattr(compressor, "momentum", 0.0) else 0.9
            model.compile(keras.optimizers.SGD(0.05, momentum=momentum),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
        started, before = time.perf_counter(), measure.interface_bytes("lo", "rx")
        steps = epochs = 0
        accuracy = 0.0
        while accuracy < target and epochs < max_epochs:
            history = model.fit(x, digits.y_train, batch_size=batch, epochs=1, verbose=0,
                                shuffle=False)
            steps += -(-len(x) // batch)
            epochs += 1
            accuracy = model.evaluate(x_test, digits.y_test, batch_size=batch, verbose=0)[1]
        rows[name] = {"seconds_to_target": time.perf_counter() - started if accuracy >= target
                      else None, "epochs": epochs, "accuracy": accuracy,
                      "bytes_per_step": (measure.interface_bytes("lo", "rx") - before) / steps,
                      "train_loss": history.history["loss"][-1]}
    if kdist.cluster().is_chief:
        with open(out_path, "w") as f:
            json.dump(rows, f)


def run(command, **kwargs):
    return subprocess.run(command, check=True, **kwargs)


def shaped_run(rate, all_reduce, out_path, args):
    namespace = f"kdist-bench-{os.getpid()}"
    run(["ip", "netns", "add", namespace])
    try:
        run(["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"])
        rate_bits = {"gbit": 10 ** 9, "mbit": 10 ** 6}[rate[-4:]] * float(rate[:-4])
        burst = max(32_000, int(rate_bits / 8 / 100))  # 10 ms worth of bytes
        run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
             "rate", rate, "burst", str(burst), "latency", "50ms"])
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        # --network host: the tasks share the shaped namespace (a private network of the
        # launcher's own, its default, would hold another loopback, unshaped)
        run(["ip", "netns", "exec", namespace, sys.executable, "-m", "kdist", "launch",
             "--workers", "2", "--network", "host", "--timeout", str(args.timeout), "--",
             sys.executable,
             os.path.abspath(__file__), "--job-out", out_path, "--target", str(args.target),
             "--max-epochs", str(args.max_epochs), "--all-reduce", all_reduce], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=args.timeout + 60)
    finally:
        run(["ip", "netns", "delete", namespace])
    with open(out_path) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1gbit,100mbit")
    parser.add_argument("--exchanges", default="auto,ring",
                        help="all_reduce values to compare: auto (kdist's default), ring (TF's)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, taking turns")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--all-reduce", help=argparse.SUPPRESS)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job_out:
        return job(args.job_out, args.target, args.max_epochs, args.all_reduce)
    exchanges = args.exchanges.split(",")
    unknown = sorted(set(exchanges) - set(EXCHANGES))
    if unknown:
        parser.error(f"--exchanges: {', '.join(unknown)} unknown; use {', '.join(EXCHANGES)}")

    runs: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for rate in args.rates.split(","):
                for all_reduce in exchanges:  # taking turns on each link
                    out = os.path.join(scratch, f"{rate}-{all_reduce}-{round_}.json")
                    runs.setdefault(rate, {}).setdefault(all_reduce, []).append(
                        shaped_run(rate, all_reduce, out, args))
                    print(f"round {round_ + 1}, {rate}, all_reduce={all_reduce}: done", flush=True)
    results = {rate: {all_reduce: medians(rounds) for all_reduce, rounds in by_exchange.items()}
               for rate, by_exchange in runs.items()}
    folder = results_table.save("compression", table(results, args.target, args.rounds), results)
    plot(results, os.path.join(folder, "compression.png"))


def medians(rounds: list) -> dict:
    """Each compressor's rows over the rounds: the median seconds and bytes per step, every
    round's seconds, and the epochs and accuracy (the same each round: no shuffling, one seed)."""
    rows = {}
    for name in NAMES:
        taken = [r[name] for r in rounds]
        seconds = [t["seconds_to_target"] for t in taken]
        rows[name] = {"seconds_to_target": statistics.median(seconds) if None not in seconds
                      else None, "seconds_runs": seconds,
                      "bytes_per_step": statistics.median(t["bytes_per_step"] for t in taken),
                      "epochs": taken[0]["epochs"], "accuracy": taken[0]["accuracy"],
                      "epochs_runs": [t["epochs"] for t in taken]}
    return rows


def table(results, target, rounds):
    lines = [f"Time to {target:.0%} test accuracy on the UCI digits, MLP 64-1024-1024-10, 2 "
             f"MWMS workers on a loopback shaped by tc tbf, {os.cpu_count()} CPU cores; each "
             "compressor under kdist's default exchange (its TCP ring on CPU workers) and "
             "TensorFlow's collectives (`all_reduce=\"ring\"`), taking turns, median of "
             f"{rounds} runs each (range: the fastest and slowest run). Speed-up: against no "
             "compression on the same exchange; TF time / ring time: TensorFlow's collectives' "
             "seconds over the ring's, same compressor and link.", "",
             "| link | exchange | compressor | bytes/step | reduction | epochs | accuracy "
             "| seconds to target | range | speed-up | TF time / ring time |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rate, by_exchange in results.items():
        for all_reduce, rows in by_exchange.items():
            base = rows["none"]
            for name in NAMES:
                row = rows[name]
                seconds = row["seconds_to_target"]
                reached = [s for s in row["seconds_runs"] if s is not None]
                spread = f"{min(reached):.1f}-{max(reached):.1f}" if reached else "-"
                tf_seconds = by_exchange.get("ring", {}).get(name, {}).get("seconds_to_target")
                lines.append(
                    f"| {rate} | {EXCHANGES[all_reduce]} | {name} | {row['bytes_per_step']:,.0f} | "
                    f"{base['bytes_per_step'] / row['bytes_per_step']:.1f}x | {row['epochs']} | "
                    f"{row['accuracy']:.4f} | {seconds and f'{seconds:.1f}' or 'not reached'} | "
                    f"{spread} | {_ratio(base['seconds_to_target'], seconds)} | "
                    f"{_ratio(tf_seconds, seconds) if all_reduce != 'ring' else '-'} |")
    return "\n".join(lines)


def _ratio(numerator, denominator):
    return f"{numerator / denominator:.2f}" if numerator and denominator else "-"


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    bars = [(f"{rate}, {EXCHANGES[all_reduce]}", rows) for rate, by_exchange in results.items()
            for all_reduce, rows in by_exchange.items()]
    width = 0.8 / len(bars)
    for i, (label, rows) in enumerate(bars):
        seconds = [rows[n]["seconds_to_target"] or 0 for n in NAMES]
        axis.bar([k + i * width for k in range(len(NAMES))], seconds, width, label=label)
    axis.set_xticks([k + width * (len(bars) - 1) / 2 for k in range(len(NAMES))], NAMES)
    axis.set_ylabel("seconds to target accuracy")
    axis.set_title("kdist gradient compression, 2 workers, shaped loopback")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
