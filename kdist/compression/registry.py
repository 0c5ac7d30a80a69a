"""Compressors by name, one line each: what `kdist.scope(compression="...")` and
`kdist plan --compression` accept. The command line reads the names without importing
TensorFlow; a compressor's module loads when its name is used.

A line is ``"name": "module:Class"``, or ``"name:ARGUMENT": "module:Class"`` for a compressor
whose name takes an argument, which its class turns into itself (`Compressor.from_argument`).
To add a compressor: its file in kdist/compression/, and its line here.

>>> from_name("powersgd:4")
PowerSGD(min_compression_rate=2.0, start_step=0, rank=4, error_feedback=True, warm_start=True, seed=0)
>>> from_name("none") is None
True
>>> spelled()
'none, fp16, bf16, powersgd:RANK or topk:RATIO'
"""

from __future__ import annotations

import importlib

from kdist.validators import UsageError

COMPRESSORS = {
    "fp16": "kdist.compression.casting:FP16",
    "bf16": "kdist.compression.casting:BF16",
    "powersgd:RANK": "kdist.compression.powersgd:PowerSGD",
    "topk:RATIO": "kdist.compression.topk:TopK",
}


def spelled() -> str:
    """Every name as the command line and the errors spell it."""
    names = ["none", *COMPRESSORS]
    return ", ".join(names[:-1]) + " or " + names[-1]


def classes() -> dict[str, str]:
    """Class name -> its module, for every compressor of the registry."""
    return dict(reversed(target.split(":")) for target in COMPRESSORS.values())


def from_name(text: str | None, **options):
    """``name`` or ``name:ARGUMENT`` (`spelled`) -> a compressor (None for ``none``); `options` go
    to the compressor's constructor."""
    name, _, argument = (text or "none").strip().lower().partition(":")
    line = next((key for key in COMPRESSORS if key.partition(":")[0] == name), None)
    if name == "none" and not argument and not options:
        return None
    if line is None:
        raise UsageError("compression", f"{text!r} is not a compressor", f"use {spelled()}")
    if argument and ":" not in line:
        raise UsageError("compression", f"{text!r}: {name} takes no argument", f"use {name}")
    module, _, name_of_class = COMPRESSORS[line].partition(":")
    compressor = getattr(importlib.import_module(module), name_of_class)
    try:
        return compressor.from_argument(argument or None, **options)
    except (TypeError, ValueError) as err:
        raise UsageError("compression", f"{text!r}: {err}", f"use {spelled()}") from None
