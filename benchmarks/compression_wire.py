"""Bytes each compressor puts on the wire, and the accuracy it reaches, with 2 MultiWorkerMirrored workers.

    sudo python benchmarks/compression_wire.py [--steps 10] [--epochs 8]

(needs root and iproute2). Runs tests/programs/wire_job.py, the program tests/test_compression_wire.py
checks, under `kdist launch --workers 2 --private-network`: the job has a network namespace of its
own, so the loopback byte counter counts its packets only. Per compressor: bytes per step of the
784-1024-1024-10 MLP against the ring all-reduce lower bound, and digits test accuracy after the
same epochs (no shuffling, same seed). Saves benchmarks/results/compression_wire.{json,md}.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import results_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABELS = {"none": "none", "fp16": "FP16", "powersgd_r4": "PowerSGD rank 4",
          "topk_1pct": "TopK 1% (momentum 0.9, float16 values, warm-up epoch at 1/16)"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per compressor")
    parser.add_argument("--epochs", type=int, default=8, help="epochs of the accuracy run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "kdist", "launch", "--workers", "2", "--timeout", "1800",
                        "--private-network", "--", sys.executable, "tests/programs/wire_job.py", out,
                        str(args.steps), str(args.epochs)], check=True, cwd=ROOT,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), stdout=subprocess.DEVNULL)
        wire = json.load(open(os.path.join(out, "wire.json")))
    results, baseline = wire["results"], wire["results"]["none"]["bytes_per_step"]
    lines = [f"Bytes per step on the wire (loopback of the job's own network namespace, both "
             f"directions once), 2 MWMS workers, MLP 784-1024-1024-10 = {wire['parameters']:,} "
             f"parameters, {args.steps} measured steps; digits test accuracy after the same "
             f"{args.epochs} epochs (MLP 64-1024-1024-10, no shuffling). Ring all-reduce lower "
             f"bound: {wire['ring_lower_bound_bytes'] / 1e6:.2f} MB.", "",
             "| compressor | bytes/step | vs ring lower bound | fewer bytes than none | "
             "digits accuracy |", "|---|---|---|---|---|"]
    for name, label in LABELS.items():
        sent = results[name]["bytes_per_step"]
        lines.append(f"| {label} | {sent / 1e6:.3f} MB | {sent / wire['ring_lower_bound_bytes']:.3f}x "
                     f"| {baseline / sent:.2f}x | {results[name]['digits_accuracy']:.4f} |")
    results_table.save("compression_wire", "\n".join(lines), wire)


if __name__ == "__main__":
    main()
