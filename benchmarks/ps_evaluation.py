"""Parameter-server evaluation: on the chief alone vs sharded over 2 workers (chief + 2 workers + 2 ps).

    python benchmarks/ps_evaluation.py [--examples 100000] [--widths 256,2048] [--rounds 1]

For each hidden width, one real local cluster per mode (`kdist.scope(ps_evaluation="chief")`, then
`"workers"`), one after the other in this one invocation. The chief builds an MLP 784-W-W-10
(first kernel split over the 2 ps) and evaluates it `--repeats` times on a dataset function that
generates `--examples` rows, batch 256, where the pipeline runs (no array is shipped); the first
evaluation of each cluster (tracing, dataset creation on the workers) is not counted. Prints a
table and saves benchmarks/results/ps_evaluation.{json,md}.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import results_table

BATCH = 256


def job(out_path, mode, examples, repeats, width):
    """Runs on every task of the cluster; the chief measures."""
    import kdist

    kdist.strategy(ps_evaluation=mode)  # ps and workers serve here and exit when the chief is done
    import keras
    import tensorflow as tf

    def rows(context):
        def example(index):
            features = tf.random.stateless_uniform((784,), seed=tf.stack([index, 0]))
            return features, tf.cast(tf.reduce_sum(features[:10]) > 5.0, "int32")

        return tf.data.Dataset.range(examples).map(example).batch(BATCH)

    keras.utils.set_random_seed(0)  # the same weights in every cluster: the same accuracy
    with kdist.scope():
        inputs = keras.Input((784,))
        hidden = kdist.layers.PartitionedDense(width, activation="relu")(inputs)
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
        model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    seconds, results = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        results.append(model.evaluate(rows, verbose=0, return_dict=True))
        seconds.append(time.perf_counter() - started)
    with open(out_path, "w") as f:
        json.dump({"mode": mode, "seconds": seconds, "results": results}, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--widths", default="256,2048", help="hidden widths, one table row pair each")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job_out:
        return job(args.job_out, args.mode, args.examples, args.repeats, args.width)

    runs = [run_cluster(mode, width, args) for _ in range(args.rounds)
            for width in (int(w) for w in args.widths.split(",")) for mode in MODES]
    lines = ["| model | evaluation | seconds (median) | examples/s | speed-up vs chief alone | "
             "accuracy |", "|---|---|---|---|---|---|"]
    for width in sorted({run["width"] for run in runs}):
        timed = {mode: [s for run in runs if (run["mode"], run["width"]) == (mode, width)
                        for s in run["seconds"][1:]] for mode in MODES}
        chief = statistics.median(timed["chief"])
        for mode, seconds in timed.items():
            median = statistics.median(seconds)
            accuracy = sorted({run["results"][-1]["accuracy"] for run in runs
                               if (run["mode"], run["width"]) == (mode, width)})
            lines.append(f"| MLP 784-{width}-{width}-10 | {MODES[mode]} | {median:.2f} | "
                         f"{args.examples / median:.0f} | {chief / median:.2f} | "
                         f"{', '.join(f'{a:.4f}' for a in accuracy)} |")
    results_table.save(
        "ps_evaluation",
        f"`model.evaluate` under ParameterServerStrategy, {args.examples} generated examples "
        f"(784 features), batch {BATCH}, chief + 2 workers + 2 ps on {os.cpu_count()} CPU cores: "
        f"median of {args.repeats - 1} timed evaluations per cluster, {args.rounds} cluster(s) per "
        "row (each cluster's first evaluation not counted). Every cluster builds the same "
        "(untrained) weights, so both modes must give the same accuracy.\n\n" + "\n".join(lines),
        {"machine": f"{os.cpu_count()} CPU cores", "runs": runs})


MODES = {"chief": "chief alone", "workers": "sharded over 2 workers"}


def run_cluster(mode, width, args) -> dict:
    """One real local cluster evaluating in `mode`; returns the chief's measurements."""
    from kdist.cluster import ClusterSpec
    from kdist.launch import Launcher

    spec = ClusterSpec.local_layout({"chief": 1, "worker": 2, "ps": 2})
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "run.json")
        command = [sys.executable, os.path.abspath(__file__), "--job-out", out, "--mode", mode,
                   "--width", str(width), "--examples", str(args.examples),
                   "--repeats", str(args.repeats)]
        env = dict(os.environ, KDIST_CHIEF_GRACE="2", TF_CPP_MIN_LOG_LEVEL="2")
        with open(os.devnull, "w") as quiet:
            code = Launcher(spec, command, timeout=900, output=quiet, env=env).run()
        if code != 0:
            sys.exit(f"the {mode} cluster (width {width}) failed with exit code {code}")
        return dict(json.load(open(out)), width=width)


if __name__ == "__main__":
    main()
