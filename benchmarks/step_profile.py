"""Where the default path's 2-worker step goes: TensorFlow's profiler on worker 0 of the peers
benchmark's setup (`benchmarks/peers.py`: the MLP, per-worker batch 128, SGD, each worker pinned
to one core with one compute thread, 127.0.0.1), each step cut into the phases it runs in turn:

    python benchmarks/step_profile.py [--hidden 1024] [--rounds 3] [--steps 30]

- Keras and Python around the traced step (the step's wall time outside the function's run);
- input: the function's start to its first matmul (the next batch, and TensorFlow's all-reduce of
  "has every worker data" that its distributed iterator runs before each multi-worker step);
- forward and backward: the first matmul to the gradients' sum;
- the gradients' sum (kdist's TCP ring, a `numpy_function`: waiting for the peer included);
- the optimizer's update, between the two sums;
- the logs' sum (the loss's mean, on the ring), and the function's end after it.

Each round profiles 10 warm steps of a fresh 2-worker job and takes the median step of each
phase; the table shows the median over rounds beside the 1-worker step (t1, unprofiled, the same
round). Saves benchmarks/results/step_profile.{json,md}.
"""

import argparse
import glob
import gzip
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import peers  # noqa: E402
import results_table  # noqa: E402

PHASES = ("Keras and Python around the step", "input (next batch, TF's has-data all-reduce)",
          "forward and backward", "gradients' sum (kdist's ring)", "optimizer update",
          "logs' sum (ring) and the function's end")
PROFILED = range(10, 20)  # the warm steps of the second epoch that the profiler records


def worker(args):
    measure.pin_worker_to_one_core()
    measure.one_thread()  # before TensorFlow starts
    import kdist

    kdist.strategy()
    import keras
    import numpy as np
    import tensorflow as tf

    spec = json.loads(os.environ["TF_CONFIG"])
    workers, rank = len(spec["cluster"]["worker"]), spec["task"]["index"]
    x, y = peers.data(args.per_worker_batch, args.steps, 0)
    x, y = np.concatenate([x] * workers), np.concatenate([y] * workers)
    with kdist.scope():
        model = peers._keras_mlp(keras, args.hidden)
    profiled = rank == 0 and workers > 1

    class Profile(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, step, logs=None):
            if profiled and self.epoch == 1 and step == PROFILED.start:
                tf.profiler.experimental.start(args.trace)

        def on_train_batch_end(self, step, logs=None):
            if profiled and self.epoch == 1 and step == PROFILED.stop:
                tf.profiler.experimental.stop()

    step = peers.timed_fit_keras(keras, model, x, y, args.per_worker_batch * workers, args.steps,
                                 callbacks=[Profile()])
    if rank == 0:
        phases = _phases(args.trace) if profiled else {}
        with open(args.out, "w") as f:
            json.dump({"step": step, "phases": phases}, f)


def _phases(folder: str) -> dict:
    """Median milliseconds of each phase over the profiled steps (module docstring)."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin

    path = glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.xplane.pb"))[0]
    data, _ = plugin.xspace_to_tools_data([path], "trace_viewer@", {})
    trace = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"),
                    key=lambda e: e["ts"])
    thread = lambda e: names.get((e["pid"], e["tid"]), "")  # noqa: E731
    steps = [e for e in events if e["name"].startswith("multi_step_on_iterator")]
    runs = [e for e in events if e["name"] == "KernelAndDeviceFunc::Run"]
    ops = [e for e in events if thread(e).startswith("tf_Compute")]
    per_step = []
    for this, after in zip(steps, steps[1:]):
        run = next(r for r in runs if this["ts"] <= r["ts"] < after["ts"])
        start, end = run["ts"], run["ts"] + run["dur"]
        inside = [e for e in ops if start <= e["ts"] < end]
        matmul = next(e["ts"] for e in inside if "MatMul" in e["name"])
        sums = [e for e in inside if e["name"] == "PyFunc"]
        gradients, logs = sums[0], sums[-1]
        per_step.append([after["ts"] - this["ts"] - run["dur"], matmul - start,
                         gradients["ts"] - matmul, gradients["dur"],
                         logs["ts"] - gradients["ts"] - gradients["dur"], end - logs["ts"]])
    return {name: statistics.median(s[k] for s in per_step) / 1e3
            for k, name in enumerate(PHASES)} | {"steps_profiled": len(per_step)}


def launch(args, workers, folder) -> dict:
    out, trace = os.path.join(folder, "result.json"), os.path.join(folder, f"trace{workers}")
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out, "--trace",
               trace, "--steps", str(args.steps), "--per-worker-batch",
               str(args.per_worker_batch), "--hidden", str(args.hidden)]
    return measure.local_job(command, workers, out, "step_profile")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--per-worker-batch", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as folder:
            rounds.append({"one": launch(args, 1, folder), "two": launch(args, 2, folder)})
    one = statistics.median(r["one"]["step"] for r in rounds) * 1e3
    two = statistics.median(r["two"]["step"] for r in rounds) * 1e3
    phases = {name: statistics.median(r["two"]["phases"][name] for r in rounds)
              for name in PHASES}
    lines = [f"MLP 784-{args.hidden}-{args.hidden}-10, per-worker batch {args.per_worker_batch}, "
             f"SGD, kdist's default path; median of {args.rounds} rounds (each phase: the median "
             f"of {len(PROFILED)} profiled steps of worker 0).", "",
             "| phase of the 2-worker step | ms | share of the step |", "|---|---|---|"]
    lines += [f"| {name} | {ms:.1f} | {ms / sum(phases.values()):.0%} |"
              for name, ms in phases.items()]
    lines += [f"| **sum of the phases (profiled step)** | **{sum(phases.values()):.1f}** | |",
              f"| step, 2 workers, unprofiled | {two:.1f} | |",
              f"| step, 1 worker (t1), unprofiled | {one:.1f} | |"]
    results_table.save("step_profile", "\n".join(lines),
                       {"phases_ms": phases, "step_2_workers_ms": two, "step_1_worker_ms": one,
                        "rounds": rounds, "args": vars(args)})


if __name__ == "__main__":
    main()
