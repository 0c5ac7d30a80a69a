"""`kdist verify`: does this program train as one device does with the global batch?

Runs the program's first `fit` for a few steps on a local cluster, recording every replica's
batches and its state before and after each step (`kdist.wiring.verify`), replays each step's
global batch on one device from the state the step started from, and prints the step that differs
most, its largest difference and the first variable that differs.
Exit code: 0 the same within the dtype's tolerance, 1 different, else the failing run's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from kdist import envvars, exit_codes
from kdist.cli import parsing
from kdist.cluster.spec import ClusterSpec
from kdist.validators import UsageError

# Imported inside functions: the launcher and the runs' plan, which `kdist --help` must not load.


def add(commands) -> None:
    verify = commands.add_parser(
        "verify", help="check that a program trains as one device does with the global batch",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    verify.set_defaults(run=run)
    verify.add_argument("--workers", type=parsing.positive_count, default=2,
                        help="worker tasks of the distributed run (default 2)")
    verify.add_argument("--steps", type=parsing.positive_count, default=5,
                        help="steps of the first fit to compare (default 5)")
    verify.add_argument("--timeout", type=parsing.seconds, default=600.0,
                        help="seconds each of the two runs may take (default 600)")
    verify.add_argument("--keep", default=None, metavar="DIR",
                        help="keep the recorded batches, variables and report.json in DIR")
    verify.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")


def run(args) -> int:
    from kdist.launch import Launcher, check_program
    from kdist.verify_plan import REPORT, Plan

    command = parsing.after_dashes(args.command)
    check_program(command)
    folder = args.keep or tempfile.mkdtemp(prefix="kdist-verify-")
    os.makedirs(folder, exist_ok=True)
    try:
        Plan(folder, "record", args.steps).write()
        spec = ClusterSpec.local_layout({"worker": args.workers}, source="kdist verify")
        env = dict(os.environ, **{envvars.VERIFY: folder})
        code = Launcher(spec, command, timeout=args.timeout, env=env).run()
        if code != exit_codes.OK:
            print(f"kdist verify: the distributed run ended with exit code {code}; nothing to "
                  "compare", file=sys.stderr)
            return code
        Plan(folder, "replay", args.steps, _recorded_replicas(folder)).write()
        code = _one_device(command, env, args.timeout, folder)
        if code != exit_codes.OK or not os.path.exists(os.path.join(folder, REPORT)):
            print(f"kdist verify: the one-device run ended with exit code {code}"
                  f"{'' if code else ' without a report'}", file=sys.stderr)
            return code or 1
        return _print_report(os.path.join(folder, REPORT), args.workers)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def _recorded_replicas(folder: str) -> int:
    """The replicas the distributed run recorded (every worker's)."""
    import json

    records = [name for name in os.listdir(folder) if name.startswith("record-")]
    if not records:
        raise UsageError("command", "the program ended without calling model.fit on a model "
                         "(nothing to compare)", "verify a program that trains with fit")
    replicas = 0
    for name in records:
        with open(os.path.join(folder, name)) as f:
            replicas += len(json.load(f)["replicas"])
    return replicas


def _one_device(command: list, env: dict, timeout: float, folder: str) -> int:
    """The program once, as one process on the default strategy (no cluster), its lines shown
    as `[one-device] ...` without TensorFlow's start-up logging. Past `timeout` it is asked for
    its threads' stacks (shown among its lines), then killed."""
    from kdist.launch.group import is_tf_noise

    alone = {k: v for k, v in env.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    alone.update({envvars.STRATEGY: "default", "PYTHONUNBUFFERED": "1",
                  envvars.FAILURE_FILE: os.path.join(folder, "failure-one-device.json")})
    alone.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with subprocess.Popen(command, env=alone, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as process:
        expired = threading.Event()
        timer = threading.Timer(timeout, lambda: (expired.set(), _stacks_then_kill(process)))
        timer.start()
        try:
            for line in process.stdout:
                if line.strip() and not is_tf_noise(line):
                    print(f"[one-device] {line.rstrip()}", flush=True)
            process.wait()
        finally:
            timer.cancel()
    if expired.is_set():
        print(f"kdist verify: the one-device run took more than {timeout:g} s (--timeout)",
              file=sys.stderr)
        return exit_codes.TIMED_OUT
    return exit_codes.of_returncode(process.returncode)


def _stacks_then_kill(process: subprocess.Popen) -> None:
    """Asks the run for its Python stacks (kdist registered the signal in it), then kills it."""
    from kdist.launch.group import ask_for_stacks

    ask_for_stacks([process])
    with contextlib.suppress(ProcessLookupError):
        process.kill()


def _print_report(path: str, workers: int) -> int:
    import json

    with open(path) as f:
        report = json.load(f)
    agree, one = report["workers_agree"], report["one_device"]
    print(f"kdist verify: {report['steps']} step(s) of the first fit on {workers} worker(s) "
          f"({report['replicas']} replicas), the model's {report['weights']} weights against one "
          "device with the same global batches, each step from the distributed run's state before "
          "it")
    print(f"  every worker holds the same {report['variables']} variables (the optimizer's too): "
          f"{_verdict(agree)}")
    print(f"  against one device, at step {report['step']} (the furthest beyond its bound, or the "
          f"closest to it): {_verdict(one)}")
    cause = _update_cause(one["first_differing"], report["replicas"])
    if cause:
        print(f"  {cause}")
    if report["bounds"]["per_move"]:
        bounds = report["bounds"]
        print(f"  allowed beside each dtype's tolerance: {bounds['per_move']:.3g} of the "
              "step's largest move of a weight on one device, as the policy "
              f"{bounds['policy']} computes in {bounds['compute_dtype']}, which two replicas "
              "round differently from one device")
    same = agree["first_differing"] is None and one["first_differing"] is None
    if not same and report["lossy"]:
        print(f"  expected: the gradients are compressed with {report['lossy']}, which is lossy; "
              "verify without compression to check the rest")
    if not same and report.get("per_replica_statistics"):
        layers = report["per_replica_statistics"]
        print(f"  expected: {len(layers)} BatchNormalization layer(s) ({', '.join(layers)}) "
              "normalize each replica's share with its own statistics; "
              "BatchNormalization(synchronized=True) makes them one device's")
    print("kdist verify: the same training as one device" if same else
          "kdist verify: DIFFERENT from one device")
    return exit_codes.OK if same else exit_codes.VERIFY_DIFFERS


def _update_cause(first: dict | None, replicas: int) -> str | None:
    """What the first differing variable's update ratio to one device's says, if anything."""
    ratio = (first or {}).get("update_ratio")
    if ratio is None or abs(ratio - 1) < 0.05:
        return None
    said = f"its update is {ratio:.2f}x one device's"
    if abs(ratio - replicas) < 0.05 * replicas:
        said += (f": as when a loss is not divided by the {replicas} replicas (a train_step's "
                 "own ops.mean over its batch); divide it by "
                 "kdist.strategy().num_replicas_in_sync, or compute it with self.compute_loss")
    elif abs(ratio * replicas - 1) < 0.05:
        said += f": as when a loss is divided by the {replicas} replicas twice"
    return said


def _verdict(comparison: dict) -> str:
    largest = comparison["largest"]
    text = "largest difference 0" if largest["variable"] is None else \
        f"largest difference {largest['difference']:.3g} ({largest['variable']})"
    first = comparison["first_differing"]
    if first is None:
        return f"yes, {text}"
    return (f"NO, {text}; first variable that differs: {first['variable']} at "
            f"{first['index']}: {first['value']:.8g} against {first['expected']:.8g} (tolerance "
            f"{first['tolerance']:g} x (1 + |value|) for {first['dtype']}"
            + (f" + {first['allowance']:.3g} for rounding" if first.get("allowance") else "")
            + ")")
