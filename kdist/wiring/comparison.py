"""Variables of a distributed run against one device's, element by element, with a tolerance
fit for each dtype (`kdist verify`, `kdist.wiring.verify`).

>>> differs(np.float32(1.0), np.float32(1.0 + 1e-6), "float32")
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


def differs(distributed, reference, dtype: str) -> bool:
    """Whether an element of `distributed` is further from `reference` than `dtype` allows."""
    tolerance = TOLERANCE.get(dtype, 0.0)
    return bool(np.any(np.abs(np.asarray(distributed, "float64") - reference)
                       > tolerance * (1 + np.abs(np.asarray(reference, "float64")))))


def compare(one_device: list, workers: dict, paths: list, dtypes: list) -> dict:
    """Each worker's variables (`workers`: task -> values, in the model's order) against one
    device's, and against the first worker's."""
    first = next(iter(workers.values()))
    return {"workers": list(workers), "variables": len(paths),
            "workers_agree": _difference(list(workers.values()), first, paths, dtypes),
            "one_device": _difference(list(workers.values()), one_device, paths, dtypes)}


def _difference(runs: list, reference: list, paths: list, dtypes: list) -> dict:
    """The largest difference of any run from `reference` and the first variable (in the
    model's order) further from it than its dtype allows."""
    largest = {"difference": 0.0, "variable": None}
    first = None
    for k, (path, dtype) in enumerate(zip(paths, dtypes)):
        expected = np.asarray(reference[k], "float64")
        for run in runs:
            gap = np.abs(np.asarray(run[k], "float64") - expected)
            if gap.size and gap.max() > largest["difference"]:
                largest = {"difference": float(gap.max()), "variable": path}
            if first is None and differs(run[k], expected, dtype):
                where = np.unravel_index(int(np.argmax(gap)), gap.shape) if gap.ndim else ()
                first = {"variable": path, "index": [int(i) for i in where], "dtype": dtype,
                         "value": float(np.asarray(run[k], "float64")[where]),
                         "expected": float(expected[where]),
                         "tolerance": TOLERANCE.get(dtype, 0.0)}
    return {"largest": largest, "first_differing": first}
