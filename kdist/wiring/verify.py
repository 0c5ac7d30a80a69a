"""`kdist verify`'s two runs of the user's program, inside it: record, then replay on one device.

The promise is "n devices x b = one device x nb". The replica check sees replicas that disagree,
never replicas that agree on a wrong answer; this checks the promise itself on the user's model.
`kdist verify` (`kdist.cli.verify`) writes a plan into a folder and runs the program twice with
``KDIST_VERIFY=<folder>``; each run acts at its first `fit` only:

1. **record** (distributed, every worker): each replica's batch of the first steps, as its
   `train_step` receives it; the state (the model's variables and the optimizer's) before the
   first step and after each step (the chief: every worker holds the same), and each worker's
   variables after the last recorded step. Then the process ends: the rest of the program is not
   run.
2. **replay** (one process, the default strategy): the same global batches (every replica's share,
   in replica order) on one device, each step from the state the distributed run had before it;
   after each step the weights are compared with the distributed run's, with a tolerance fit for
   each dtype, and the report (the step furthest beyond its bound, or closest to it) is written
   for the command to print.

Step by step, not the last step only: a model with ReLUs (any kink) is chaotic over steps, and
two runs that part by a rounding error can part by a whole update a few steps on, when one
activation lands on the other side of its kink (CI, 21fabaf: a small Conv2D on MNIST, 5.07e-05
apart after 4 steps of SGD, about one example's share of an update, where the exact exchange is
1e-7 apart at each step). From the same state, one step's roundoff stays roundoff.

Both runs leave out `BackupAndRestore` (a backup would start one of them elsewhere) and the
validation data (it changes no variable), each said on its own line.

The comparison itself: `kdist.wiring.comparison`.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import numpy as np

from kdist import replicas, verify_plan
from kdist.callbacks import BackupAndRestore as KdistBackup
from kdist.keras_seam import keras_internals
from kdist.strategies import is_parameter_server
from kdist.validators import UsageError
from kdist.wiring import batch_statistics, comparison

logger = logging.getLogger("kdist")

INITIAL = "initial.npz"


def prepare(plan: verify_plan.Plan, model, strategy, spec, arguments: dict, options) -> list:
    """Changes this fit's `arguments` for `plan`'s phase (`spec`: the strategy's cluster, None for
    one process; `options`: the model's TrainingOptions), its own last callback added; returns the
    callbacks to add first."""
    verify_plan.mark_done()
    if is_parameter_server(strategy):
        raise UsageError("kdist verify", "ParameterServerStrategy trains asynchronously, so no "
                         "one-device run takes the same steps", "verify the model under "
                         "MultiWorkerMirrored (no ps tasks), then train it with parameter servers")
    if model.jit_compile is True:
        raise UsageError("jit_compile", "kdist verify records each replica's batch in its step, "
                         "which XLA cannot compile", "compile with jit_compile=False to verify")
    task = _task(spec)
    _leave_out(arguments, task)
    leads = spec is None or spec.is_chief  # every worker starts from the same variables
    steps = Recording(plan, task, leads, model, strategy, options.compression) \
        if plan.phase == "record" else Replay(plan, task, leads, model, strategy)
    keras_internals.wrap_train_step(model, steps.wrap)
    arguments["callbacks"] = [*(arguments.get("callbacks") or []), steps.last]
    if isinstance(steps, Replay):
        arguments.update(x=steps.dataset(), y=None, sample_weight=None, class_weight=None,
                         batch_size=None, epochs=1, initial_epoch=0, shuffle=False,
                         steps_per_epoch=steps.steps)
    return [steps.callback]


def finish(plan: verify_plan.Plan, spec) -> None:
    """Ends the process after the fit `plan` acted at: the rest of the program is not run, nor
    the interpreter's finalization (its files are written; TensorFlow's threads once held a
    one-device run at exit for over 240 s in CI)."""
    done = "recorded" if plan.phase == "record" else "replayed on one device"
    print(f"kdist verify ({_task(spec)}): the first fit's steps {done}; the rest of the program "
          "is not run", flush=True)
    sys.stderr.flush()
    os._exit(0)


def _task(spec) -> str:
    return spec.task if spec is not None and spec.task else "local"


def _file(kind: str, task: str, extension: str) -> str:
    """A file of `task`'s record: e.g. batches-worker-0.npz."""
    return f"{kind}-{task.replace(':', '-')}.{extension}"


def _leave_out(arguments: dict, task: str) -> None:
    import keras

    callbacks = list(arguments.get("callbacks") or [])
    backups = [c for c in callbacks if isinstance(c, (keras.callbacks.BackupAndRestore,
                                                      KdistBackup))]
    if backups:
        logger.warning("kdist verify (%s): BackupAndRestore left out of both runs (a backup "
                       "would start one of them from another step)", task)
        arguments["callbacks"] = [c for c in callbacks if c not in backups]
    if arguments.get("validation_data") is not None or arguments.get("validation_split"):
        logger.warning("kdist verify (%s): validation left out (it changes no variable)", task)
        arguments.update(validation_data=None, validation_split=0.0)


class _Steps:
    """The first `plan.steps` steps of this fit: `train_step` (wrapped by `wrap`) hands every
    replica's batch to `keep`; once each replica took the steps, the fit stops and `reached`
    runs (at the fit's end if the data ends first)."""

    def __init__(self, plan: verify_plan.Plan, task: str, leads: bool, model, strategy):
        import keras

        self.plan, self.task, self.leads, self.model = plan, task, leads, model
        self.strategy = strategy  # the fit's, where the optimizer's state is built
        self.batches: dict[int, list] = {}  # replica id -> [each step's flat arrays]
        self.structure = None  # the nesting of a step's data, its leaves numbered
        self.done = False
        # first of the fit's callbacks: a step's end is seen before the user's callbacks change
        # a variable; last: a step's beginning after they did (a learning rate they set)
        self.callback = keras.callbacks.LambdaCallback(
            on_train_begin=lambda logs: self.begin(),
            on_train_batch_end=lambda batch, logs: self._batch_end(),
            on_train_end=lambda logs: self._end())
        self.last = keras.callbacks.LambdaCallback(
            on_train_batch_begin=lambda batch, logs: self.step_begin(self.taken()))

    def wrap(self, train_step):
        import functools

        import tensorflow as tf

        @functools.wraps(train_step)
        def step(data):
            leaves = [leaf for leaf in tf.nest.flatten(data) if leaf is not None]
            if not all(isinstance(leaf, tf.Tensor) for leaf in leaves):
                raise UsageError("kdist verify", "a batch holds sparse or ragged tensors, which "
                                 "it cannot record", "verify with dense inputs")
            self.structure = _numbered(data)
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            kept = tf.py_function(self._keep, [replica, *leaves], tf.int32)
            with tf.control_dependencies([kept]):
                return train_step(data)

        return step

    def _keep(self, replica, *leaves) -> int:
        self.batches.setdefault(int(replica), []).append([leaf.numpy() for leaf in leaves])
        return 0

    def taken(self) -> int:
        return min((len(steps) for steps in self.batches.values()), default=0)

    def _batch_end(self) -> None:
        if not self.done:
            self.step_end(self.taken())
        if not self.done and self.taken() >= self.plan.steps:
            self.model.stop_training = True
            self.done = True
            self.reached(self.taken())

    def _end(self) -> None:
        if not self.done:
            self.done = True
            self.reached(self.taken())

    def begin(self) -> None:
        raise NotImplementedError

    def build_optimizer(self) -> None:
        """The optimizer's state, before the first step: saved and assigned with the model's.
        Keras builds it at the first step when the data's shapes are not known beforehand."""
        import contextlib

        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built and self.model.trainable_variables:
            with self.strategy.scope() if self.strategy is not None else contextlib.nullcontext():
                optimizer.build(self.model.trainable_variables)

    def step_begin(self, taken: int) -> None:
        """Before the steps that follow `taken` ones (one call per `steps_per_execution`)."""

    def step_end(self, taken: int) -> None:
        """After `taken` steps in all (a multiple of `steps_per_execution`, or the data's end)."""

    def reached(self, steps: int) -> None:
        raise NotImplementedError


class Recording(_Steps):
    """The distributed run: this worker's batches, and the variables before and after; and the
    gradients' compressor, if any (lossy: the report says a difference is expected)."""

    def __init__(self, plan: verify_plan.Plan, task: str, leads: bool, model, strategy,
                 compressor):
        super().__init__(plan, task, leads, model, strategy)
        self.lossy = None if compressor is None else repr(compressor)
        self.written = None  # (digest, path) of the state written last

    def begin(self) -> None:
        self.build_optimizer()
        self._save(INITIAL)

    def step_begin(self, taken: int) -> None:
        self._save(_state("before", taken))

    def step_end(self, taken: int) -> None:
        self._save(_state("after", taken))

    def _save(self, name: str) -> None:
        """The chief writes the state. The state before a step is most often the one after the
        step before (no callback changed it): that file is linked, not written again."""
        if self.leads:
            self.written = _save_state(os.path.join(self.plan.folder, name), self.model,
                                       self.written)

    def reached(self, steps: int) -> None:
        arrays = {f"s{s}_r{r}_l{k}": leaf for r, batches in self.batches.items()
                  for s, leaves in enumerate(batches[:steps]) for k, leaf in enumerate(leaves)}
        folder = self.plan.folder
        np.savez(os.path.join(folder, _file("batches", self.task, "npz")), **arrays)
        _save_state(os.path.join(folder, _file("final", self.task, "npz")), self.model)
        with open(os.path.join(folder, _file("record", self.task, "json")), "w") as f:
            json.dump({"task": self.task, "replicas": sorted(self.batches), "steps": steps,
                       "structure": self.structure, "lossy": self.lossy}, f)


class Replay(_Steps):
    """The one-device run: every recorded global batch, from the recorded start; at the end, the
    comparison with every worker (`report.json`)."""

    def __init__(self, plan: verify_plan.Plan, task: str, leads: bool, model, strategy):
        super().__init__(plan, task, leads, model, strategy)
        self.records = _records(plan.folder)
        self.steps = min(record["steps"] for record in self.records)
        if self.steps == 0:
            raise UsageError("kdist verify", "the distributed run recorded no step",
                             "give fit data for at least one step")
        self.global_batches = _global_batches(plan.folder, self.records, self.steps)

    def dataset(self):
        """The recorded global batches, as the distributed run's `train_step` received them."""
        import tensorflow as tf

        structure = self.records[0]["structure"]
        first = self.global_batches[0]
        signature = [tf.TensorSpec([d if all(b[k].shape[i] == d for b in self.global_batches)
                                    else None for i, d in enumerate(leaf.shape)],
                                   tf.as_dtype(leaf.dtype)) for k, leaf in enumerate(first)]
        flat = tf.data.Dataset.from_generator(lambda: (tuple(b) for b in self.global_batches),
                                              output_signature=tuple(signature))
        return flat.map(lambda *leaves: _packed(structure, list(leaves)))

    def begin(self) -> None:
        self.build_optimizer()
        described = _described(os.path.join(self.plan.folder, INITIAL))
        _check_same_model(_state_variables(self.model), described)
        self.start: list = []  # the state the step started from (step_begin assigns it)
        self.compared: dict[int, dict] = {}  # steps taken -> that state's comparison

    def step_begin(self, taken: int) -> None:
        # from the distributed run's state: one step's roundoff, never carried on
        self.start = self._assign(_state("before", taken))

    def step_end(self, taken: int) -> None:
        recorded, _ = _load_state(os.path.join(self.plan.folder, _state("after", taken)))
        self.compared[taken] = self._compare({"recorded": recorded}, weights_only=True)

    def _assign(self, name: str) -> list:
        values, _ = _load_state(os.path.join(self.plan.folder, name))
        for variable, value in zip(_state_variables(self.model), values):
            variable.assign(value)
        return values

    def _compare(self, runs: dict, weights_only: bool = False) -> dict:
        """The state now (the model's weights only, or with the optimizer's variables) against
        each of `runs` (name -> values of the whole state), allowed what the policy's roundoff
        makes of the largest move of a trainable weight since `self.start`.

        Against one device, the weights: an optimizer's state that went wrong shows in the
        weights it updates at that same step, and its slots' moves are no scale for their
        rounding (Adam's first moment moves by a tenth of the gradient's change)."""
        variables = _state_variables(self.model)
        weights = {id(v) for v in self.model.weights}
        trainable = {id(v) for v in self.model.trainable_weights}
        kept = [k for k, v in enumerate(variables) if not weights_only or id(v) in weights]
        variables, start = [variables[k] for k in kept], [self.start[k] for k in kept]
        runs = {name: [values[k] for k in kept] for name, values in runs.items()}
        one_device = [np.asarray(v.numpy()) for v in variables]
        policy = self.model.dtype_policy
        shares = [comparison.per_move(v.dtype, policy.compute_dtype) for v in variables]
        trained = [k for k, v in enumerate(variables) if id(v) in trainable]
        moved = comparison.largest_move([one_device[k] for k in trained],
                                        [start[k] for k in trained])
        allowances = [share * moved for share in shares]
        report = comparison.compare(one_device, runs, [v.path for v in variables],
                                    [comparison.dtype_name(v.dtype) for v in variables],
                                    allowances, start)
        report["bounds"] = {"policy": policy.name, "compute_dtype": policy.compute_dtype,
                            "per_move": max(shares, default=0.0)}
        return report

    def reached(self, steps: int) -> None:
        workers = {}
        for record in self.records:
            path = os.path.join(self.plan.folder, _file("final", record["task"], "npz"))
            workers[record["task"]], _ = _load_state(path)
        report = self._compare(workers)  # the workers against each other
        step, closest = comparison.worst_step(self.compared)
        report["one_device"], report["step"] = closest["one_device"], step
        report["weights"] = closest["variables"]
        report["replicas"] = self.plan.replicas
        report["per_replica_statistics"] = batch_statistics.per_replica(self.model)
        report["lossy"] = self.records[0]["lossy"]
        report["steps"] = steps
        with open(os.path.join(self.plan.folder, verify_plan.REPORT), "w") as f:
            json.dump(report, f, indent=1)


def _check_same_model(variables: list, described: list) -> None:
    mine = [[v.path, str(v.dtype)] for v in variables]
    if len(mine) != len(described) or any(a[1] != b[1] for a, b in zip(mine, described)):
        raise UsageError("kdist verify", f"the one-device run built {len(mine)} variables, the "
                         f"distributed run {len(described)} (or other dtypes), the model's and "
                         "its optimizer's", "build the same model and optimizer whatever the "
                         "number of workers (no size read from TF_CONFIG)")


def _state(when: str, taken: int) -> str:
    """The chief's state file "before" or "after" the step (or execution) at `taken` steps."""
    return f"{when}-{taken}.npz"


def _records(folder: str) -> list:
    names = sorted(n for n in os.listdir(folder) if n.startswith("record-") and
                   n.endswith(".json"))
    if not names or not os.path.exists(os.path.join(folder, INITIAL)):
        raise UsageError("kdist verify", "the distributed run recorded no fit",
                         "call model.fit on a model compiled inside kdist.scope()")
    records = []
    for name in names:
        with open(os.path.join(folder, name)) as f:
            records.append(json.load(f))
    return records


def _global_batches(folder: str, records: list, steps: int) -> list:
    """Each step's global batch: every replica's share of it, in replica order, leaf by leaf."""
    shares = {}  # replica id -> [each step's leaves]
    for record in records:
        with np.load(os.path.join(folder, _file("batches", record["task"], "npz"))) as arrays:
            for replica in record["replicas"]:
                leaves = len([n for n in arrays.files if n.startswith(f"s0_r{replica}_")])
                shares[replica] = [[arrays[f"s{s}_r{replica}_l{k}"] for k in range(leaves)]
                                   for s in range(steps)]
    order = sorted(shares)
    leaves = len(shares[order[0]][0])
    return [[np.concatenate([shares[r][s][k] for r in order]) for k in range(leaves)]
            for s in range(steps)]


def _numbered(data, counter=None):
    """`data`'s nesting as JSON, its non-None leaves numbered in `tf.nest.flatten`'s order."""
    counter = counter if counter is not None else iter(range(1 << 30))
    if isinstance(data, dict):
        return {"dict": {k: _numbered(data[k], counter) for k in sorted(data)}}
    if isinstance(data, (list, tuple)):
        items = list(data)
        while items and items[-1] is None:  # (x, y, None): what a dataset yields as (x, y)
            items.pop()
        return {type(data).__name__: [_numbered(v, counter) for v in items]}
    return None if data is None else next(counter)


def _packed(structure, leaves: list):
    """The nesting `_numbered` described, its leaves taken from `leaves`."""
    if isinstance(structure, dict):
        if "dict" in structure:
            return {k: _packed(v, leaves) for k, v in structure["dict"].items()}
        kind, items = next(iter(structure.items()))
        packed = [_packed(v, leaves) for v in items]
        return tuple(packed) if kind == "tuple" else packed
    return None if structure is None else leaves[structure]


def _state_variables(model) -> list:
    """What a step reads and changes that every replica holds alike: the model's weights, then
    its optimizer's variables (slots, iterations, a loss scale), as the replica check compares
    them. Per-replica state (metric totals, accumulators, compressor residuals) is each run's
    own: the one-device run keeps its own."""
    return replicas.checked_variables(model)


def _save_state(path: str, model, last: tuple | None = None) -> tuple:
    """Writes the model's state to `path` (npz, and its description beside), or links the file
    of `last` (digest, path) when the state is the same; returns (digest, path) of this one."""
    import hashlib
    import shutil

    variables = _state_variables(model)
    values = [np.asarray(v.numpy()) for v in variables]
    digest = hashlib.sha256()
    for value in values:
        digest.update(np.ascontiguousarray(value).tobytes())
    if last is not None and last[0] == digest.hexdigest():
        for suffix in ("", ".json"):
            try:
                os.link(last[1] + suffix, path + suffix)
            except OSError:  # a file system without hard links
                shutil.copyfile(last[1] + suffix, path + suffix)
        return digest.hexdigest(), path
    np.savez(path, **{f"v{k}": value for k, value in enumerate(values)})
    with open(path + ".json", "w") as f:
        json.dump([[v.path, str(v.dtype)] for v in variables], f)
    return digest.hexdigest(), path


def _described(path: str) -> list:
    with open(path + ".json") as f:
        return json.load(f)


def _load_state(path: str) -> tuple[list, list]:
    with np.load(path) as arrays:
        values = [arrays[f"v{k}"] for k in range(len(arrays.files))]
    return values, _described(path)
