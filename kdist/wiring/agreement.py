"""What every worker of a MultiWorkerMirrored `fit` must agree on, compared before it starts.

Workers that run the same program with different arguments (a batch size, a layer width, an
option read from the environment) meet in collectives that do not match: TensorFlow then fails
with "Collective instance 123 expected type 0 and data_type 9", a shape mismatch, or waits until
a timeout. At each `fit`, every worker publishes what it is about to train (the variables' paths,
shapes and dtypes, the batch size, the epochs and steps, the number of examples, kdist's options)
through TensorFlow's coordination service, reads every other worker's, and names the first
difference and the worker before any step runs. A model built outside the multi-worker strategy
kdist built trains as N separate models on N workers: refused where it was compiled inside the
scope, said in one line where it is wholly local.

>>> first_difference({"batch_size": 32, "epochs": 2}, {"batch_size": 64, "epochs": 2})
('batch_size', 32, 64)
"""

from __future__ import annotations

import hashlib
import json
import logging
import random

from kdist import global_state
from kdist.keras_seam import inputs, keras_internals, tf_internals
from kdist.strategies import is_multi_worker

logger = logging.getLogger("kdist")
# published beside the facts; a difference is no error
RANDOM, TF_SEED = "python_random", "tensorflow_seed"


def facts(model, arguments: dict, options) -> dict:
    """What this worker's `fit` will train: every field must be equal on every worker."""
    import numpy as np

    x = arguments.get("x")
    rows = len(x) if isinstance(x, np.ndarray) else None
    return {"model": _config(model),
            "variables": [[v.path, list(v.shape), str(v.dtype)] for v in model.variables],
            "batch_size": arguments.get("batch_size"), "epochs": arguments.get("epochs"),
            "steps_per_epoch": arguments.get("steps_per_epoch"), "rows": rows,
            "options": repr(options)}


def _config(model):
    """The model's configuration (its layers and their settings, known before it is built), as
    JSON sees it; None for a model that cannot say (a subclass without get_config)."""
    try:
        return _unnamed(json.loads(json.dumps(model.get_config(), default=repr, sort_keys=True)))
    except Exception:  # noqa: BLE001 (NotImplementedError, or a config that cannot be read)
        return None


def _unnamed(config):
    """`config` without its names (counters that may differ between workers)."""
    if isinstance(config, dict):
        return {k: _unnamed(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_unnamed(v) for v in config]
    return config


def first_difference(mine: dict, theirs: dict):
    """The first field whose values differ, with both values (None: they agree).

    >>> first_difference({"model": {"layers": [{"units": 8}]}},
    ...                  {"model": {"layers": [{"units": 16}]}})
    ('model layers[0].units', 8, 16)
    """
    for field in mine:
        if field == "variables" and [v[1:] for v in mine[field]] == \
                [v[1:] for v in theirs.get(field) or []]:
            continue
        if mine[field] != theirs.get(field):
            if field == "variables":
                return _first_variable_difference(mine[field], theirs.get(field) or [])
            if field == "model":
                return _config_difference(mine[field], theirs.get(field), "model")
            return field, mine[field], theirs.get(field)
    return None


def _config_difference(a, b, path: str):
    """Where two configurations first differ: its path and both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _config_difference(a.get(key), b.get(key),
                                          f"{path}{'.' if '[' in path or '.' in path else ' '}"
                                          f"{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for k, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _config_difference(x, y, f"{path}[{k}]")
    return path, a, b


def _first_variable_difference(mine: list, theirs: list):
    """By position: shapes and dtypes (names are counters' that may differ, e.g. after a model
    only the chief built)."""
    for k in range(max(len(mine), len(theirs))):
        a = mine[k] if k < len(mine) else None
        b = theirs[k] if k < len(theirs) else None
        if a is None or b is None or a[1:] != b[1:]:
            name = (a or b)[0]
            return f"variable {name}", _shape(a), _shape(b)
    return None


def _shape(variable) -> str:
    return "absent" if variable is None else f"shape {tuple(variable[1])} {variable[2]}"


def check(model, spec, tasks: list[str], arguments: dict, options, timeout: float) -> None:
    """Compares this worker's `facts` with every other worker's; raises ValueError naming the
    first difference and the worker. Waits for each up to `timeout` seconds."""
    count = global_state.process().agreed_fits
    global_state.process().agreed_fits = count + 1
    key = f"kdist/agreement/fit-{count}/"
    mine = facts(model, arguments, options)
    python_random, tf_seed = random_state(), inputs.program_seed()
    tf_internals.set_job_key(key + spec.task,
                             json.dumps({**mine, RANDOM: python_random, TF_SEED: tf_seed}))
    agrees, seeds_agree = True, tf_seed is not None
    for task in tasks:
        if task == spec.task:
            continue
        try:
            theirs = json.loads(tf_internals.get_job_key(key + task, int(timeout * 1000)))
        except Exception as error:  # noqa: BLE001 (TF's error for a key never written)
            raise RuntimeError(f"kdist: {spec.task} waited {timeout:.0f} s for {task} to start "
                               f"fit #{count + 1}; it did not (it may run other code, or have "
                               f"stopped): {type(error).__name__}") from None
        agrees = agrees and theirs.pop(RANDOM, None) == python_random
        seeds_agree = seeds_agree and theirs.pop(TF_SEED, None) == tf_seed
        difference = first_difference(mine, theirs)
        if difference is not None:  # said alike by both: the first worker's value first
            field, here, there = difference
            (a, a_value), (b, b_value) = sorted([(spec.task, here), (task, there)],
                                                key=lambda pair: tasks.index(pair[0]))
            raise ValueError(
                f"kdist: the workers do not train the same thing: {field} is {a_value} on "
                f"{a} and {b_value} on {b}. Fix: run the same program with the same "
                "arguments and environment on every worker (a setting read per worker, such as "
                "a batch size or a layer width, must be equal on all)")
    global_state.process().python_random_agrees = agrees
    global_state.process().tensorflow_seed_agrees = seeds_agree


def random_state() -> str:
    """A digest of Python's `random` state: equal on every worker of a program that seeded it
    (`keras.utils.set_random_seed`) and drew from it alike."""
    return hashlib.sha256(repr(random.getstate()).encode()).hexdigest()[:16]


def refuse_model_outside(model, model_strategy, current) -> None:
    """A model created outside the multi-worker strategy kdist built trains alone on each
    worker: refused with the fix where it was compiled inside (its optimizer belongs to the
    strategy, and the step would fail), said in one line where it is wholly local (trained on
    one worker alone, as a reference model on the chief may be). In one process such a model is
    simply a local model."""
    if model_strategy is not None or current is None or not is_multi_worker(current):
        return
    fix = "create the model and call compile() inside `with kdist.scope():`"
    workers = tf_internals.num_workers(current)
    if keras_internals.optimizer_strategy(model.optimizer) is current:
        raise ValueError(f"kdist: this model was created outside kdist.scope() and compiled "
                         f"inside it: its variables are this worker's alone, its optimizer the "
                         f"{workers} workers'. Fix: {fix}")
    state = global_state.process().local_models_said
    if id(model) not in state:
        state.add(id(model))
        logger.warning("kdist: this model was created outside kdist.scope(): fit trains it on "
                       "this worker alone, not with the other %d worker(s). To train it on all, "
                       "%s", workers - 1, fix)
