"""Compressors by name, for command lines and configuration files.

>>> from kdist.compression import from_name
>>> from_name("powersgd:4")
PowerSGD(min_compression_rate=2.0, start_step=0, rank=4, error_feedback=True, warm_start=True, seed=0)
>>> from_name("none") is None
True
"""

from __future__ import annotations

from kdist.validators import UsageError

NAMES = "none, fp16, bf16, powersgd:RANK or topk:RATIO"


def from_name(text: str | None, **options):
    """``none``, ``fp16``, ``bf16``, ``powersgd:RANK`` (default 4), ``topk:RATIO`` (default 0.01)
    -> a compressor (None for ``none``). `options` go to the compressor's constructor."""
    from kdist.compression.casting import BF16, FP16
    from kdist.compression.powersgd import PowerSGD
    from kdist.compression.topk import TopK

    name, _, argument = (text or "none").strip().lower().partition(":")
    try:
        if name == "none" and not argument and not options:
            return None
        if name in ("fp16", "bf16") and not argument:
            return {"fp16": FP16, "bf16": BF16}[name](**options)
        if name == "powersgd":
            return PowerSGD(rank=int(argument or 4), **options)
        if name == "topk":
            return TopK(float(argument or 0.01), **options)
    except (TypeError, ValueError) as err:
        raise UsageError("compression", f"{text!r}: {err}", f"use {NAMES}") from None
    raise UsageError("compression", f"{text!r} is not a compressor", f"use {NAMES}")
