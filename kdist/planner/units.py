"""The units `kdist plan` reads: link speeds, latencies, the host cost, a compression name.

>>> parse_latency("2ms")
0.002
"""

from __future__ import annotations

import math
import re

from kdist.compression.registry import from_name
from kdist.validators import UsageError

_PREFIXES = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_NUMBER = r"((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"  # ASCII digits only


def parse_bandwidth(text: str) -> float:
    """A link speed -> bits per second: ``1Gbit``, ``1Gbps``, ``1 Gb/s``, ``10G`` (bits, as links
    are sold), ``100Mbit/s``; ``125MB/s`` and ``1GBps`` are bytes (a capital B).

    >>> parse_bandwidth("1Gbps") == parse_bandwidth("1 Gb/s") == parse_bandwidth("125MB/s") == 1e9
    True
    >>> parse_bandwidth("1.2.3Gbit")
    Traceback (most recent call last):
    ...
    kdist.validators.UsageError: --bandwidth: '1.2.3Gbit' is not a link speed. Fix: write a positive number and a unit, e.g. 100Mbit, 1Gbps, 10Gb/s, 125MB/s
    """
    match = re.fullmatch(rf"\s*{_NUMBER}\s*([kKmMgGtT]?)(bits?|b|B|[bB]ytes?)?(/s|ps)?\s*", text or "")
    value = math.nan
    if match and (match.group(2) or match.group(3)):
        bits_per_unit = 8 if (match.group(3) or "b").startswith(("B", "byte")) else 1
        value = float(match.group(1)) * _PREFIXES[match.group(2).lower()] * bits_per_unit
    if not (math.isfinite(value) and value > 0):
        raise UsageError("--bandwidth", f"{text!r} is not a link speed",
                         "write a positive number and a unit, e.g. 100Mbit, 1Gbps, 10Gb/s, 125MB/s")
    return value


def parse_latency(text: str) -> float:
    """``"50us"``, ``"1ms"`` -> seconds."""
    match = re.fullmatch(rf"\s*{_NUMBER}\s*(s|ms|us|ns)\s*", text or "")
    value = float(match.group(1)) * _SECONDS[match.group(2)] if match else math.nan
    if not math.isfinite(value):
        raise UsageError("--latency", f"{text!r} is not a duration",
                         "write a number and s, ms, us or ns, e.g. 50us")
    return value


def parse_compression(text: str | None):
    """A name of `kdist.compression.registry` -> a kdist compressor (None for ``none``)."""
    try:
        return from_name(text)
    except UsageError as err:
        raise err.renamed("--compression") from None


def parse_host_cost(text: str) -> float | None:
    """``auto`` -> None (measure it); a number of ns per byte (>= 0) -> seconds per byte."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError("--host-cost", f"{text!r} is not a cost",
                         "use auto, or a number of ns per byte >= 0")
    return value * 1e-9
