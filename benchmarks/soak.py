"""Memory over a long run: a worker's resident memory across many short epochs, kdist on 2
workers against the same program in one plain Keras process (no kdist).

    python benchmarks/soak.py [--epochs 300] [--rounds 1]

The work (issue "reliability round three"): 256 rows of 8 features per worker, batch 32 per
worker (8 steps an epoch), an MLP 8-32-2, ModelCheckpoint (weights, every epoch) and CSVLogger,
`fit(..., epochs=N)`; each process records its RSS at every epoch's end. A third contender,
"tf MWMS loop", is TensorFlow alone on the same 2 workers (no Keras, no kdist): the same MLP
trained by a loop that, like `fit`, iterates a distributed dataset once per epoch and all-reduces
the gradients each step; it is the floor that MultiWorkerMirroredStrategy itself sets. The
growth is the
least-squares slope over the epochs after the first 30 (tracing, first allocations), per 100
epochs; file descriptors and threads at the end next to the start. Saves
benchmarks/results/soak.{json,md}.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import results_table  # noqa: E402

ROWS, FEATURES, PER_WORKER_BATCH, WARMUP = 256, 8, 32, 30
CONTENDERS = ("keras", "kdist", "tf MWMS loop")
MULTI_WORKER = ("kdist", "tf MWMS loop")  # 2 workers each; keras: one process


def data(workers: int, rng):
    """Every worker's rows of the soak's task (`rng`: NumPy's generator, seeded)."""
    x = rng.normal(size=(ROWS * workers, FEATURES)).astype("float32")
    return x, (x[:, :4].sum(1) > x[:, 4:].sum(1)).astype("int32")


def train(args):
    """One process of one contender: fits and writes its RSS per epoch to args.out."""
    import psutil

    if args.contender == "tf MWMS loop":
        return train_tf_loop(args)

    if args.contender == "kdist":
        import kdist

        workers, rank, scope = kdist.cluster().num_workers, kdist.cluster().task_index, kdist.scope
    else:
        import contextlib

        workers, rank, scope = 1, 0, contextlib.nullcontext
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = data(workers, rng)
    with scope():
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    process = psutil.Process()
    samples = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            samples.append(process.memory_info().rss)

    folder = tempfile.mkdtemp(prefix="kdist-soak-")
    start = {"fds": process.num_fds(), "threads": process.num_threads()}
    model.fit(x, y, batch_size=PER_WORKER_BATCH * workers, epochs=args.epochs, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(folder, "m.weights.h5"),
                                                         save_weights_only=True),
                         keras.callbacks.CSVLogger(os.path.join(folder, "log.csv")), Record()])
    write(args, process, samples, start, workers, rank)


def train_tf_loop(args):
    """TensorFlow's MultiWorkerMirroredStrategy alone: the soak's MLP and data, SGD by hand,
    one distributed iterator per epoch (as `fit` makes), an all-reduce of the gradients per
    step."""
    import numpy as np
    import psutil
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.cluster_resolver.cluster_spec().num_tasks("worker")
    rank = strategy.cluster_resolver.task_id
    rng = np.random.default_rng(0)
    x, y = data(workers, rng)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(PER_WORKER_BATCH * workers))
    with strategy.scope():
        weights = [tf.Variable(rng.normal(size=shape).astype("float32") * 0.1)
                   for shape in ((FEATURES, 32), (32,), (32, 2), (2,))]

    @tf.function
    def step(batch):
        def replica_step(inputs, labels):
            with tf.GradientTape() as tape:
                hidden = tf.nn.relu(inputs @ weights[0] + weights[1])
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels, hidden @ weights[2] + weights[3]))
            grads = tf.distribute.get_replica_context().all_reduce(
                "MEAN", tape.gradient(loss, weights))
            for weight, grad in zip(weights, grads):
                weight.assign_sub(0.01 * grad)
        strategy.run(replica_step, args=batch)

    process = psutil.Process()
    start = {"fds": process.num_fds(), "threads": process.num_threads()}
    samples = []
    for _ in range(args.epochs):
        for batch in dataset:
            step(batch)
        samples.append(process.memory_info().rss)
    write(args, process, samples, start, workers, rank)


def write(args, process, samples: list, start: dict, workers: int, rank: int) -> None:
    """This process's RSS per epoch, and its fds and threads at the start and now."""
    end = {"fds": process.num_fds(), "threads": process.num_threads()}
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump({"rss": samples, "start": start, "end": end}, f)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"workers": workers}, f)


def growth_per_100_epochs(rss: list) -> float:
    """MiB per 100 epochs: the least-squares slope of RSS over the epochs after WARMUP."""
    import numpy as np

    kept = np.asarray(rss[WARMUP:], dtype="float64") / 2**20
    slope = np.polyfit(np.arange(len(kept)), kept, 1)[0]
    return float(slope * 100)


def run(contender: str, epochs: int, folder: str) -> list[dict]:
    out = os.path.join(folder, f"{contender.replace(' ', '_')}.json")
    command = [sys.executable, os.path.abspath(__file__), "--train", "--contender", contender,
               "--epochs", str(epochs), "--out", out]
    if contender in MULTI_WORKER:
        workers = measure.local_job(command, 2, out, f"soak: {contender}",
                                    timeout=3600)["workers"]
    else:
        import subprocess

        subprocess.run(command, check=True, timeout=3600,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        workers = 1
    reports = []
    for rank in range(workers):
        with open(f"{out}.{rank}") as f:
            report = json.load(f)
        reports.append({"contender": contender, "task": rank,
                        "growth_mib_per_100_epochs": growth_per_100_epochs(report["rss"]),
                        "rss_end_mib": report["rss"][-1] / 2**20,
                        "fds": [report["start"]["fds"], report["end"]["fds"]],
                        "threads": [report["start"]["threads"], report["end"]["threads"]]})
    return reports


def table(rows: list, args) -> str:
    lines = [f"Resident memory over {args.epochs} epochs of 8 steps (MLP 8-32-2, ModelCheckpoint "
             f"+ CSVLogger), growth fitted after epoch {WARMUP}; {args.rounds} round(s).", "",
             "| contender | process | RSS growth per 100 epochs | RSS at the end | fds start -> end "
             "| threads start -> end |", "|---|---|---|---|---|---|"]
    for row in rows:
        process = f"worker {row['task']}" if row["contender"] in MULTI_WORKER else "one process"
        lines.append(f"| {row['contender']} | {process} "
                     f"| {row['growth_mib_per_100_epochs']:.1f} MiB | {row['rss_end_mib']:.0f} MiB "
                     f"| {row['fds'][0]} -> {row['fds'][1]} | {row['threads'][0]} -> "
                     f"{row['threads'][1]} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--name", default="soak")
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:
        return train(args)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for contender in CONTENDERS:
                rows += run(contender, args.epochs, folder)
    text = table(rows, args)
    print(text)
    results_table.save(args.name, text, {"rows": rows, "args": vars(args)})


if __name__ == "__main__":
    main()
