"""Variables of a distributed run against one device's, element by element, with a tolerance
fit for each dtype (`kdist verify`, `kdist.wiring.verify`), and an allowance for a model that
computes in a less precise dtype than its variables (a `mixed_bfloat16` policy).

>>> bool(excess(np.float32(1.0 + 1e-6), np.float32(1.0), "float32") > 1)
False
>>> compare([np.zeros(2)], {"worker:0": [np.array([0.0, 0.5])]}, ["w"], ["float32"])[
...     "one_device"]["first_differing"]["index"]
[1]
"""

from __future__ import annotations

import numpy as np

# Largest |distributed - one device| per element, relative to 1 + |one device|, for the sums of a
# few steps taken in another order (float32: measured 1e-7 on exact paths).
TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "float16": 1e-2, "bfloat16": 3e-2}


def dtype_name(dtype) -> str:
    """A variable's dtype as `TOLERANCE` names it."""
    return "bfloat16" if str(dtype) == "bfloat16" else str(np.dtype(str(dtype)))


# A model computing in a dtype less precise than its variables' (mixed precision): two replicas
# round their half batches' sums differently from one device's whole batch, at each step, so the
# variables part by a share of how far the step moved them. Allowed: 8 units of the compute
# dtype's roundoff (2^-8 for bfloat16's 8-bit significand, 2^-11 for float16's 11) times the
# largest move of any of the model's weights in the step on one device. The model's, not each
# variable's own: an optimizer that divides by the gradient's scale (Adam, RMSprop, Adagrad) turns
# a gradient's rounding into a move of the order of the learning rate, however little the
# variable moved (CI saw a Dense kernel whose gradient nearly cancelled move 1.2e-4 in Adam(0.01)'s
# third step, and part from one device by 3.3e-5: 0.26 of its own move, 0.003 of the step's
# largest). Measured with kdist verify's program, 5 steps of Adam(0.01) under mixed_bfloat16, each
# from the distributed run's state, 6 runs: the exact exchange at 0.06 to 0.12 of what it is
# allowed; a sum counted wrong on every worker 9.1 to 9.5 times beyond it (3 runs).
ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
ROUNDOFFS_ALLOWED = 8


def per_move(variable_dtype, compute_dtype) -> float:
    """The share of the step's largest move on one device that two replicas may differ by, because
    the model computes in `compute_dtype` (0 where that is as precise as the variable).

    >>> per_move("float32", "bfloat16"), per_move("float32", "float32"), per_move("float16", "float16")
    (0.03125, 0.0, 0.0)
    """
    compute, own = dtype_name(compute_dtype), dtype_name(variable_dtype)
    if compute not in ROUNDOFF or TOLERANCE.get(own, 0.0) >= TOLERANCE[compute]:
        return 0.0
    return ROUNDOFFS_ALLOWED * ROUNDOFF[compute]


def largest_move(one_device, initial) -> float:
    """The largest move of an element from `initial` (the state the step started from) to
    `one_device`, over every array given."""
    return max((float(np.abs(np.asarray(after, "float64") - np.asarray(before, "float64")).max())
                for after, before in zip(one_device, initial) if np.size(after)), default=0.0)


def excess(distributed, reference, dtype: str, allowed: float = 0.0) -> float:
    """The largest difference of an element of `distributed` from `reference`, as a multiple of
    what `dtype` allows there (plus `allowed`, an `allowance`): over 1, it differs."""
    reference = np.asarray(reference, "float64")
    return _excess(np.abs(np.asarray(distributed, "float64") - reference), reference, dtype,
                   allowed)


def _excess(gap, reference, dtype: str, allowed: float) -> float:
    """`excess` of the elements' differences `gap` from `reference` (float64 arrays)."""
    if not gap.size:
        return 0.0
    bound = TOLERANCE.get(dtype, 0.0) * (1 + np.abs(reference)) + allowed
    return float(np.max(np.divide(gap, bound, out=np.where(gap > 0, np.inf, 0.0),
                                  where=bound > 0)))


def update_ratio(distributed, one_device, initial) -> float | None:
    """How many times one device's update of a variable (from `initial`) the distributed run's
    is, fitted over all its elements; None where one device did not move it.

    >>> update_ratio(np.array([1.0, 4.0]), np.array([1.5, 2.5]), np.array([2.0, 1.0]))
    2.0
    """
    ours = np.asarray(distributed, "float64") - initial
    theirs = np.asarray(one_device, "float64") - initial
    moved = float(np.sum(theirs * theirs))
    return float(np.sum(ours * theirs) / moved) if moved > 0 else None


def compare(one_device: list, workers: dict, paths: list, dtypes: list,
            allowances: list | None = None, initial: list | None = None) -> dict:
    """Each worker's variables (`workers`: task -> values, in the model's order) against one
    device's (each allowed its `allowances`, none by default), and against the first worker's
    (exactly as its dtype allows: every worker computes the same way). With the `initial`
    values, the first variable that differs from one device says its `update_ratio`."""
    first = next(iter(workers.values()))
    allowances = allowances or [0.0] * len(paths)
    against_one = _difference(list(workers.values()), one_device, paths, dtypes, allowances)
    differing = against_one["first_differing"]
    if differing is not None and initial is not None:
        k = paths.index(differing["variable"])
        ratios = [update_ratio(run[k], one_device[k], np.asarray(initial[k], "float64"))
                  for run in workers.values()]
        differing["update_ratio"] = ratios[0]
    return {"workers": list(workers), "variables": len(paths),
            "workers_agree": _difference(list(workers.values()), first, paths, dtypes,
                                         [0.0] * len(paths)),
            "one_device": against_one}


def worst_step(compared: dict) -> tuple[int, dict]:
    """Of each step's `compare` (steps taken -> report), the one whose state is furthest beyond
    its bound, or closest to it where none is beyond: (steps taken, its report).

    >>> worst_step({1: compare([np.zeros(1)], {"w": [np.zeros(1)]}, ["v"], ["float32"]),
    ...             2: compare([np.zeros(1)], {"w": [np.ones(1) * 1e-6]}, ["v"], ["float32"])})[0]
    2
    """
    step = max(sorted(compared), key=lambda s: compared[s]["one_device"]["excess"])
    return step, compared[step]


def _difference(runs: list, reference: list, paths: list, dtypes: list, allowances: list) -> dict:
    """The largest difference of any run from `reference`, the first variable (in the model's
    order) further from it than its dtype (and its allowance) allows, and the `excess`: the
    largest difference of an element as a multiple of what it is allowed (over 1: differs)."""
    largest = {"difference": 0.0, "variable": None}
    first, worst = None, 0.0
    for k, (path, dtype, allowed) in enumerate(zip(paths, dtypes, allowances)):
        expected = np.asarray(reference[k], "float64")
        for run in runs:
            gap = np.abs(np.asarray(run[k], "float64") - expected)
            if not gap.size:
                continue
            beyond = _excess(gap, expected, dtype, allowed)
            worst = max(worst, beyond)
            if gap.max() > largest["difference"]:
                largest = {"difference": float(gap.max()), "variable": path}
            if first is None and beyond > 1:
                where = np.unravel_index(int(np.argmax(gap)), gap.shape) if gap.ndim else ()
                first = {"variable": path, "index": [int(i) for i in where], "dtype": dtype,
                         "value": float(np.asarray(run[k], "float64")[where]),
                         "expected": float(expected[where]),
                         "tolerance": TOLERANCE.get(dtype, 0.0), "allowance": allowed}
    return {"largest": largest, "first_differing": first, "excess": worst}
