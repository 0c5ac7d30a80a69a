"""A recommender's whole fit: kdist on 2 workers, with and without the seam's fix
`embedding_rows_read_from_the_variable`, against plain Keras 3 in one process.

    python benchmarks/recommender.py [--rounds 2]

The work (issue "speed where users pick DDP today"): `Embedding(500_000, 64)` over 20 ids per
example, mean-pooled, Dense 256-64-1, SGD 0.05, 16,384 examples, `fit(batch_size=256 x workers,
epochs=3, shuffle=False)`. Each worker is pinned to one core with one compute thread, on
127.0.0.1; the one-process run gets one core and the same global batch. Per run: the whole fit,
the median warm step (epochs 2-3), peak RSS of each process. Rounds take turns; the table shows
medians over rounds. Saves benchmarks/results/recommender.{json,md}.
"""

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import results_table  # noqa: E402

ROWS, IDS, TABLE, WIDTH, PER_WORKER_BATCH, EPOCHS = 16_384, 20, 500_000, 64, 256, 3
CONTENDERS = ("kdist, 2 workers", "kdist, 2 workers, fix removed", "Keras 3, one process")


def train(out_path: str, distributed: bool, upstream: bool) -> None:
    """One process's fit: kdist (a worker of the launched job) or plain Keras."""
    if distributed:
        measure.pin_worker_to_one_core()
    else:
        os.sched_setaffinity(0, {0})
    measure.one_thread()
    import keras
    import numpy as np

    workers = 1
    if distributed:
        import kdist
        from kdist.keras_seam import patches

        kdist.strategy()
        if upstream:  # taken out for good: kdist installs no withdrawn patch again
            patches.patch("embedding_rows_read_from_the_variable").uninstall()
        workers = kdist.cluster().num_workers
    rng = np.random.default_rng(0)
    ids = rng.integers(0, TABLE, (ROWS, IDS)).astype("int32")
    labels = rng.random((ROWS, 1)).astype("float32")
    with kdist.scope() if distributed else contextlib.nullcontext():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((IDS,), dtype="int32"), keras.layers.Embedding(TABLE, WIDTH),
            keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    report, _ = measure.timed_fit(model, ids, labels, EPOCHS, batch_size=PER_WORKER_BATCH * 2,
                                  shuffle=False)
    measure.write_task_report(out_path, {
        **report, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "workers": workers})


def run(contender: str, folder: str) -> dict:
    out = os.path.join(folder, contender.replace(" ", "_").replace(",", ""))
    if contender.startswith("kdist"):
        command = [sys.executable, os.path.abspath(__file__), "--train", out, "--distributed",
                   *(["--upstream"] if "removed" in contender else [])]
        measure.local_job(command, 2, out + ".0", contender)
        reports = [json.load(open(f"{out}.{k}")) for k in (0, 1)]
    else:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--train", out], check=True)
        reports = [json.load(open(f"{out}.0"))]
    return {"fit_s": max(r["fit_s"] for r in reports),
            "warm_step_ms": max(r["warm_step_ms"] for r in reports),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in reports)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train")
    parser.add_argument("--distributed", action="store_true")
    parser.add_argument("--upstream", action="store_true")
    args = parser.parse_args()
    if args.train:
        return train(args.train, args.distributed, args.upstream)
    runs, medians = measure.in_rounds(CONTENDERS, args.rounds, run)
    one = medians["Keras 3, one process"]
    lines = [f"Recommender (Embedding {TABLE:,} x {WIDTH}, {IDS} ids per example, Dense "
             f"256-64-1, SGD), {ROWS:,} examples, {EPOCHS} epochs, global batch "
             f"{2 * PER_WORKER_BATCH}; medians of {args.rounds} rounds",
             "", "| run | whole fit | warm step | peak RSS per process | fit vs one process |",
             "|---|---|---|---|---|"]
    for contender, m in medians.items():
        lines.append(f"| {contender} | {m['fit_s']:.1f} s | {m['warm_step_ms']:.1f} ms | "
                     f"{m['peak_rss_mib']:.0f} MiB | {m['fit_s'] / one['fit_s']:.2f}x |")
    results_table.save("recommender", "\n".join(lines), {"runs": runs, "medians": medians})


if __name__ == "__main__":
    main()
