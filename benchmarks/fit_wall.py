"""The whole fit as users time it: kdist against Keras 2 (tf_keras) + MultiWorkerMirrored and
PyTorch DDP (gloo), each on 2 workers and on one process, on the same work.

    python benchmarks/fit_wall.py [--rounds 3] [--inputs numpy,tfdata,generator]

The work (issue "the whole fit"): the 8,000 real MNIST digits kdist ships (examples/data), an MLP
784-256-256-10, SGD 0.05, `fit(..., batch_size=64 x workers, epochs=4)` with Keras's default
shuffle, then `evaluate` on the 2,000 test digits; PyTorch: `DistributedSampler(shuffle=True)` and a
`DataLoader` of 64 per worker, the same model and epochs. Each worker process is pinned to one core
with one compute thread, on 127.0.0.1. Inputs for the Keras contenders: NumPy arrays, a tf.data
pipeline (shuffled, batched) and a Python generator of global batches.

Per run: the whole fit, each epoch, the first batch of epochs 2-4 (the epoch boundary: from the
epoch's start to its first batch's end), the median step, evaluate, the start (process start to
the first step's end) and the process's wall time as the launcher sees it (start-up and the end of
the job included). Rounds take turns; the table shows medians over rounds and the ratios to
tf_keras + MWMS and to DDP. Needs `pip install torch tf_keras` (a contender whose package is
missing is left out, saying so). Saves benchmarks/results/fit_wall.{json,md}.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

STARTED = time.time()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import results_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTENDERS = ("kdist", "tf_keras", "pytorch ddp")
INPUTS = ("numpy", "tfdata", "generator")
PER_WORKER_BATCH, EPOCHS, HIDDEN, LEARNING_RATE = 64, 4, 256, 0.05


def digits():
    import numpy as np

    data = np.load(os.path.join(ROOT, "examples", "data", "mnist_offline.npz"))
    scaled = [(data[k].reshape(len(data[k]), -1) / 255.0).astype("float32")
              for k in ("x_train", "x_test")]
    return scaled[0], data["y_train"].astype("int64"), scaled[1], data["y_test"].astype("int64")


# ------------------------------------------------------------------ Keras (kdist, tf_keras)
def keras_input(tf, kind: str, x, y, global_batch: int):
    """fit's arguments for `kind` of input."""
    if kind == "numpy":
        return {"x": x, "y": y, "batch_size": global_batch}
    if kind == "tfdata":
        return {"x": tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=1)
                .batch(global_batch)}
    steps = -(-len(x) // global_batch)

    def batches():
        import numpy as np

        rng = np.random.default_rng(1)
        while True:
            order = rng.permutation(len(x))
            for k in range(steps):
                rows = order[k * global_batch:(k + 1) * global_batch]
                yield x[rows], y[rows]

    return {"x": batches(), "steps_per_epoch": steps}


def run_keras(args, workers, contender):
    measure.one_thread()  # before TensorFlow starts
    if contender == "kdist":
        import kdist

        strategy = kdist.strategy()
        import keras
    else:
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy() if workers > 1 else \
            tf.distribute.get_strategy()
        import tf_keras as keras
    import tensorflow as tf

    x, y, x_test, y_test = digits()
    with strategy.scope():
        model = keras.Sequential([keras.Input((784,)),
                                  keras.layers.Dense(HIDDEN, activation="relu"),
                                  keras.layers.Dense(HIDDEN, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(LEARNING_RATE),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    clock = epoch_clock(keras)
    started = time.perf_counter()
    model.fit(**keras_input(tf, args.input, x, y, PER_WORKER_BATCH * workers), epochs=EPOCHS,
              verbose=0, callbacks=[clock])
    fit = time.perf_counter() - started
    started = time.perf_counter()
    model.evaluate(x_test, y_test, batch_size=PER_WORKER_BATCH * workers, verbose=0)
    return clock.report(fit, time.perf_counter() - started)


def epoch_clock(keras):
    class EpochClock(keras.callbacks.Callback):
        """Each epoch's seconds, its first batch's (from the epoch's start) and every step's."""

        def __init__(self):
            super().__init__()
            self.epochs, self.first, self.steps, self.first_step_end = [], [], [], None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_start, self.seen = time.perf_counter(), 0

        def on_train_batch_begin(self, batch, logs=None):
            self.batch_start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.seen == 0:
                self.first.append(now - self.epoch_start)
            else:
                self.steps.append(now - self.batch_start)
            self.seen += 1
            if self.first_step_end is None:
                self.first_step_end = time.time()

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(time.perf_counter() - self.epoch_start)

        def report(self, fit, evaluate):
            return run_report(fit, self.epochs, self.first, self.steps, evaluate,
                              self.first_step_end)

    return EpochClock()


def run_report(fit, epochs, first, steps, evaluate, first_step_end) -> dict:
    return {"fit": fit, "epochs": epochs, "first_batch": first,
            "median_step": statistics.median(steps), "evaluate": evaluate,
            "start": first_step_end - STARTED}


# ------------------------------------------------------------------ PyTorch DDP
def run_ddp(args, workers, contender):
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if workers > 1:
        spec = json.loads(os.environ["TF_CONFIG"])
        host, _, port = spec["cluster"]["worker"][0].rpartition(":")
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                                world_size=workers)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, 10))
    if workers > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y, x_test, y_test = (torch.from_numpy(a) for a in digits())
    train = TensorDataset(x, y)
    sampler = DistributedSampler(train, workers, rank, shuffle=True) if workers > 1 else None
    loader = DataLoader(train, batch_size=PER_WORKER_BATCH, sampler=sampler,
                        shuffle=sampler is None)
    epochs, first, steps, first_step_end = [], [], [], None
    started = time.perf_counter()
    for epoch in range(EPOCHS):
        epoch_start = time.perf_counter()
        if sampler is not None:
            sampler.set_epoch(epoch)
        batch_start = epoch_start
        for k, (inputs, labels) in enumerate(loader):
            optimizer.zero_grad()
            loss_fn(model(inputs), labels).backward()
            optimizer.step()
            now = time.perf_counter()
            (first if k == 0 else steps).append(now - (epoch_start if k == 0 else batch_start))
            first_step_end = first_step_end or time.time()
            batch_start = time.perf_counter()
        epochs.append(time.perf_counter() - epoch_start)
    fit = time.perf_counter() - started
    started = time.perf_counter()
    with torch.no_grad():  # each worker its share of the test digits, the counts summed
        share = slice(rank, None, workers)
        correct = (model(x_test[share]).argmax(1) == y_test[share]).sum().float()
        if workers > 1:
            dist.all_reduce(correct)
    evaluate = time.perf_counter() - started
    if workers > 1:
        dist.destroy_process_group()
    return run_report(fit, epochs, first, steps, evaluate, first_step_end)


# ------------------------------------------------------------------ the runs
def worker(args):
    measure.pin_worker_to_one_core()
    spec = json.loads(os.environ["TF_CONFIG"])
    workers, rank = len(spec["cluster"]["worker"]), spec["task"]["index"]
    report = (run_ddp if args.contender == "pytorch ddp" else run_keras)(
        args, workers, args.contender)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(report, f)


def launch(contender, kind, workers, folder) -> dict:
    out = os.path.join(folder, "result.json")
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--contender", contender,
               "--input", kind, "--out", out]
    env = {"KDIST_EAGER_MULTI_WORKER": "0"}  # tf_keras and torch: no kdist strategy
    for attempt in (1, 2):  # gloo's rendezvous aborted once in about 20 DDP starts here
        started = time.perf_counter()
        try:
            report = measure.local_job(command, workers, out, f"fit_wall: {contender} {kind}",
                                       env={**os.environ, **env})
        except SystemExit:
            if attempt == 2:
                raise
            print(f"fit_wall: {contender} {kind} on {workers} failed; trying once more",
                  file=sys.stderr)
            continue
        return {**report, "process_wall": time.perf_counter() - started, "attempts": attempt}


def runs_of(args) -> list[tuple[str, str, int]]:
    contenders = [c for c in args.contenders.split(",") if measure.installed(c, "fit_wall")]
    kinds = args.inputs.split(",")
    return [(c, kind, w) for c in contenders for kind in (kinds if c != "pytorch ddp"
                                                          else ["numpy"])
            for w in (1, 2)]


def median_row(contender, kind, workers, reports) -> dict:
    def med(values):
        return statistics.median(values)

    return {"contender": contender, "input": kind, "workers": workers,
            "fit_s": med(r["fit"] for r in reports),
            "epochs_2_4_s": med(med(r["epochs"][1:]) for r in reports),
            "first_batch_2_4_s": med(med(r["first_batch"][1:]) for r in reports),
            "median_step_ms": med(r["median_step"] for r in reports) * 1e3,
            "evaluate_s": med(r["evaluate"] for r in reports),
            "start_s": med(r["start"] for r in reports),
            "process_wall_s": med(r["process_wall"] for r in reports),
            "fits_s": [r["fit"] for r in reports]}


def table(rows: list, args) -> str:
    def of(contender, kind, workers):
        return next((r for r in rows if (r["contender"], r["input"], r["workers"]) ==
                     (contender, kind, workers)), None)

    lines = [f"8,000 MNIST digits, MLP 784-{HIDDEN}-{HIDDEN}-10, SGD {LEARNING_RATE}, batch "
             f"{PER_WORKER_BATCH} per worker, {EPOCHS} epochs, shuffled; evaluate on 2,000. "
             f"Each worker pinned to one core, one thread. Median of {args.rounds} round(s).", "",
             "| contender | input | workers | whole fit | / tf_keras | / DDP | epochs 2-4, each "
             "| first batch of epochs 2-4 | median step | evaluate | start | process wall |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        keras2, ddp = of("tf_keras", r["input"], r["workers"]), of("pytorch ddp", "numpy",
                                                                  r["workers"])
        versus = [f"{r['fit_s'] / other['fit_s']:.2f}" if other else "n/a"
                  for other in (keras2, ddp)]
        lines.append(f"| {r['contender']} | {r['input']} | {r['workers']} | {r['fit_s']:.2f} s | "
                     f"{versus[0]} | {versus[1]} | {r['epochs_2_4_s']:.2f} s | "
                     f"{r['first_batch_2_4_s'] * 1e3:.1f} ms | {r['median_step_ms']:.1f} ms | "
                     f"{r['evaluate_s']:.2f} s | {r['start_s']:.1f} s | "
                     f"{r['process_wall_s']:.1f} s |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--inputs", default=",".join(INPUTS))
    parser.add_argument("--name", default="fit_wall", help="the results' file name")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    plan = runs_of(args)
    reports = {run: [] for run in plan}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for run in plan:  # take turns, round after round
                reports[run].append(launch(*run, folder))
    rows = [median_row(*run, reports[run]) for run in plan]
    results_table.save(args.name, table(rows, args), {"rows": rows, "args": vars(args)})


if __name__ == "__main__":
    main()
