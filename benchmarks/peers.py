"""kdist against its peers on CPU workers: Keras 3 + kdist as a user gets it (the default path:
kdist's TCP ring sums the gradients) and with TensorFlow's collectives (``all_reduce="ring"``),
Keras 2 (tf_keras) + MultiWorkerMirroredStrategy, PyTorch DDP (gloo).

    python benchmarks/peers.py [--rounds 3] [--steps 30] [--per-worker-batch 128]

Two MLPs (784-1024-1024-10, 1,863,690 parameters; 784-256-256-10, 269,322), the same random data,
the same per-worker batch, plain SGD, each worker process pinned to one core with one compute
thread, on 127.0.0.1. Each round runs every contender on 1 and on 2 workers, taking turns; a run
reports the median of its warm steps, and the table the median over rounds:

- step time on 2 workers, and the ratio to PyTorch DDP's;
- scaling efficiency: the 1-worker step time over the 2-worker one (the per-worker batch fixed,
  so 1.0 is perfect);
- the all-reduce of the model's gradient bytes alone with each contender's collective (t2), and
  the 2-worker step over max(t1, t2), t1 the 1-worker step (the classic step-time model: 1.0 is
  a step whose exchange hides entirely behind its compute).

kdist with gradient compression runs where `--contenders` names it ("kdist fp16", "kdist bf16",
"kdist powersgd:4", "kdist topk:0.01"): on 127.0.0.1 the link is memory, so this measures what
each compressor costs where it cannot save anything (saved as peers_compression: `--name`).

Needs `pip install torch tf_keras` (tf_keras matching the installed TensorFlow; the CPU build of
PyTorch); a contender whose package is missing is left out, saying so. Saves
benchmarks/results/peers.{json,md}.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import results_table  # noqa: E402

CONTENDERS = ("kdist", "kdist TF collectives", "tf_keras", "pytorch ddp")
# kdist with gradient compression (not run by default: --contenders names them)
COMPRESSED = {f"kdist {name}": name for name in ("fp16", "bf16", "powersgd:4", "topk:0.01")}
MODELS = {"large": 1024, "small": 256}  # hidden width of the 784-h-h-10 MLP
INPUTS, CLASSES = 784, 10


def data(per_worker_batch, steps, rank):
    import numpy as np

    rng = np.random.default_rng(rank)
    x = rng.normal(size=(per_worker_batch * steps, INPUTS)).astype("float32")
    y = rng.integers(0, CLASSES, size=(per_worker_batch * steps,))
    return x, y


def timed_fit_keras(keras, model, x, y, batch, steps, callbacks=()):
    """Median seconds of the warm steps (the second of two epochs), with `callbacks` too."""
    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            times.append(time.perf_counter())

    model.fit(x, y, batch_size=batch, epochs=2, verbose=0, shuffle=False,
              callbacks=[*callbacks, Clock()])
    return statistics.median([b - a for a, b in zip(times[steps:], times[steps + 1:])])


def run_kdist(args, workers, rank):
    measure.one_thread()  # before TensorFlow starts
    import kdist

    strategy = kdist.strategy(**({"all_reduce": "ring"} if "TF" in args.contender else {}))
    import keras
    import numpy as np
    import tensorflow as tf

    x, y = data(args.per_worker_batch, args.steps, 0)  # every worker the same data: DATA sharding
    x, y = np.concatenate([x] * workers), np.concatenate([y] * workers)
    with kdist.scope(compression=COMPRESSED.get(args.contender)):
        model = _keras_mlp(keras, args.hidden)
    step = timed_fit_keras(keras, model, x, y, args.per_worker_batch * workers, args.steps)
    from kdist.exchange.comm import tcp_ring

    ring = tcp_ring(strategy)
    gradients = [tf.ones(v.shape) for v in model.trainable_variables]
    reduce = _ring_sum(tf, ring, gradients) if ring is not None else \
        _tf_all_reduce(tf, strategy, gradients)
    if workers > 1:  # the rest of a step: the logs' all-reduce (loss), the input pipeline
        logs = [tf.ones((1,))]
        args.parts = {"logs_all_reduce": measure.median_seconds(
            _ring_sum(tf, ring, logs) if ring is not None else _tf_all_reduce(tf, strategy, logs)),
            "input": _input_seconds(tf, strategy, x, y, args.per_worker_batch * workers)}
    return step, measure.median_seconds(reduce) if workers > 1 else None


def run_tf_keras(args, workers, rank):
    import tensorflow as tf

    measure.one_thread()  # before TensorFlow starts
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if workers > 1 else \
        tf.distribute.get_strategy()
    import numpy as np
    import tf_keras as keras

    x, y = data(args.per_worker_batch, args.steps, 0)
    x, y = np.concatenate([x] * workers), np.concatenate([y] * workers)
    with strategy.scope():
        model = _keras_mlp(keras, args.hidden)
    step = timed_fit_keras(keras, model, x, y, args.per_worker_batch * workers, args.steps)
    gradients = [tf.ones(v.shape) for v in model.trainable_variables]
    reduce = _tf_all_reduce(tf, strategy, gradients) if workers > 1 else None
    return step, measure.median_seconds(reduce) if workers > 1 else None


def run_ddp(args, workers, rank):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if workers > 1:
        spec = json.loads(os.environ["TF_CONFIG"])
        host, _, port = spec["cluster"]["worker"][0].rpartition(":")
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                                world_size=workers)
    hidden = args.hidden
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(INPUTS, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, CLASSES))
    if workers > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = data(args.per_worker_batch, args.steps, 0)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    times = []
    for epoch in range(2):
        for i in range(args.steps):
            batch = slice(i * args.per_worker_batch, (i + 1) * args.per_worker_batch)
            optimizer.zero_grad()
            loss_fn(model(x[batch]), y[batch]).backward()
            optimizer.step()
            if epoch:
                times.append(time.perf_counter())
    step = statistics.median([b - a for a, b in zip(times, times[1:])])
    reduce = None
    if workers > 1:
        gradient = torch.ones(_parameters(hidden))
        reduce = measure.median_seconds(lambda: dist.all_reduce(gradient))
        dist.destroy_process_group()
    return step, reduce


def _input_seconds(tf, strategy, x, y, global_batch):
    """Seconds per step of reading this worker's batch from the distributed input, as fit reads
    it (every worker reads the global batch and keeps its shard: TF's DATA auto-sharding)."""
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).repeat())
    iterator = iter(dataset)
    return measure.median_seconds(lambda: next(iterator))


def _ring_sum(tf, ring, tensors):
    """A call of kdist's ring all-reduce of the list `tensors`, from a tf.function as the step
    calls it."""
    ring_sum = tf.function(lambda: tf.numpy_function(ring.all_reduce_sums, tensors,
                                                     [tf.float32] * len(tensors), stateful=True))
    return lambda: ring_sum()[0].numpy()


def _tf_all_reduce(tf, strategy, tensors):
    """A call of the strategy's all-reduce of the list `tensors` (TensorFlow's collectives, which
    pack them as Keras's step does)."""
    all_reduce = tf.function(lambda: strategy.run(
        lambda: tf.distribute.get_replica_context().all_reduce("SUM", tensors)))
    return lambda: strategy.experimental_local_results(all_reduce())[0][0].numpy()


def _keras_mlp(keras, hidden):
    model = keras.Sequential([keras.Input((INPUTS,)), keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    model.compile(keras.optimizers.SGD(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _parameters(hidden: int) -> int:
    return INPUTS * hidden + hidden + hidden * hidden + hidden + hidden * CLASSES + CLASSES


RUNNERS = {"kdist": run_kdist, "kdist TF collectives": run_kdist, "tf_keras": run_tf_keras,
           "pytorch ddp": run_ddp, **{name: run_kdist for name in COMPRESSED}}


def worker(args):
    measure.pin_worker_to_one_core()
    spec = json.loads(os.environ["TF_CONFIG"])
    workers, rank = len(spec["cluster"]["worker"]), spec["task"]["index"]
    args.parts = {}
    step, reduce = RUNNERS[args.contender](args, workers, rank)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"step": step, "all_reduce": reduce, "parts": args.parts}, f)


def launch(args, contender, hidden, workers, folder):
    out = os.path.join(folder, "result.json")
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--contender", contender,
               "--out", out, "--steps", str(args.steps), "--per-worker-batch",
               str(args.per_worker_batch), "--hidden", str(hidden)]
    env = {"KDIST_EAGER_MULTI_WORKER": "0"}  # tf_keras and torch: no kdist strategy
    return measure.local_job(command, workers, out, f"peers: {contender}",
                             env={**os.environ, **env})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--per-worker-batch", type=int, default=128)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--name", default="peers", help="the results' file name")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    contenders = [c for c in args.contenders.split(",") if measure.installed(c, "peers")]
    models = args.models.split(",")
    runs = {(m, c, w): [] for m in models for c in contenders for w in (1, 2)}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for model in models:
                for contender in contenders:  # take turns, round after round
                    for workers in (1, 2):
                        runs[(model, contender, workers)].append(
                            launch(args, contender, MODELS[model], workers, folder))
    rows = [_row(model, contender, runs) for model in models for contender in contenders]
    tables = [_table(model, [r for r in rows if r["model"] == model], args) for model in models]
    results_table.save(args.name, "\n\n".join(tables), {"rows": rows, "args": vars(args)})


def _row(model: str, contender: str, runs) -> dict:
    one = statistics.median(r["step"] for r in runs[(model, contender, 1)])
    two = statistics.median(r["step"] for r in runs[(model, contender, 2)])
    reduce = statistics.median(r["all_reduce"] for r in runs[(model, contender, 2)])
    parts = {name: statistics.median(r["parts"][name] for r in runs[(model, contender, 2)]) * 1e3
             for name in runs[(model, contender, 2)][0]["parts"]}
    return {"model": model, "parameters": _parameters(MODELS[model]), "contender": contender,
            "step_1_worker_ms": one * 1e3, "step_2_workers_ms": two * 1e3,
            "scaling_efficiency": one / two, "all_reduce_ms": reduce * 1e3,
            "step_over_max_t1_t2": two / max(one, reduce),
            "other_ms": (two - one - reduce) * 1e3, "parts_ms": parts,
            "steps_2_workers_ms": [r["step"] * 1e3 for r in runs[(model, contender, 2)]]}


def _table(model: str, rows: list, args) -> str:
    hidden = MODELS[model]
    parameters = _parameters(hidden)
    ddp = next((r for r in rows if r["contender"] == "pytorch ddp"), None)
    lines = [f"MLP 784-{hidden}-{hidden}-10 ({parameters:,} parameters, {parameters * 4 / 1e6:.2f} "
             f"MB of gradients), per-worker batch {args.per_worker_batch}, SGD; median of "
             f"{args.rounds} rounds.", "",
             "| contender | step, 2 workers | / DDP | step, 1 worker (t1) | scaling efficiency | "
             "all-reduce of the gradients (t2) | step / max(t1, t2) | other (2 workers - t1 - t2) "
             "| of which logs' all-reduce, input |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        versus = f"{row['step_2_workers_ms'] / ddp['step_2_workers_ms']:.2f}" if ddp else "n/a"
        parts = ", ".join(f"{row['parts_ms'][k]:.1f} ms" for k in ("logs_all_reduce", "input")) \
            if row["parts_ms"] else "n/a"
        lines.append(f"| {row['contender']} | {row['step_2_workers_ms']:.1f} ms | {versus} | "
                     f"{row['step_1_worker_ms']:.1f} ms | {row['scaling_efficiency']:.2f} | "
                     f"{row['all_reduce_ms']:.1f} ms | {row['step_over_max_t1_t2']:.2f} | "
                     f"{row['other_ms']:.1f} ms | {parts} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
