"""Small argument checks shared by every module, and `UsageError`, the error they raise: it names
the argument, the problem and the fix (a `ValueError`, so callers that catch those still do).

>>> positive_int(3, "--workers")
3
>>> positive_number(-5, "--timeout")
Traceback (most recent call last):
...
kdist.validators.UsageError: --timeout: -5 is out of range. Fix: use a positive number
"""

from __future__ import annotations

import math
import os
from typing import Any


class UsageError(ValueError):
    """A bad argument: ``<field>: <problem>. Fix: <what to do>``, on one line (a field or value
    from the user's file with a newline or another control character shows it escaped)."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{_printable(field)}: {_printable(problem)}. Fix: {_printable(fix)}")

    def renamed(self, field: str) -> "UsageError":
        """The same error for another name of the field (e.g. a command-line flag)."""
        return UsageError(field, self.problem, self.fix)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _check(ok: bool, value: Any, name: str, fix: str) -> None:
    if not ok:
        raise UsageError(name, f"{value!r} is out of range", fix)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def positive_int(value: Any, name: str) -> int:
    """`value` if it is an integer >= 1."""
    _check(_is_int(value) and value >= 1, value, name, "use a positive integer")
    return value


def non_negative_int(value: Any, name: str) -> int:
    """`value` if it is an integer >= 0."""
    _check(_is_int(value) and value >= 0, value, name, "use a non-negative integer")
    return value


def positive_number(value: Any, name: str) -> float:
    """`value` if it is a finite number > 0 (seconds, rates, sizes)."""
    _check(_is_number(value) and value > 0, value, name, "use a positive number")
    return value


def seconds_from_env(name: str) -> float | None:
    """The environment variable `name` as a positive number of seconds; None when it is unset or
    blank. Anything else raises `UsageError` naming the variable and its value."""
    text = os.environ.get(name, "")
    if not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise UsageError(f"{name}={text!r}", "is not a duration", "use a positive number of seconds")
    return value


def non_negative_number(value: Any, name: str) -> float:
    """`value` if it is a finite number >= 0."""
    _check(_is_number(value) and value >= 0, value, name, "use a non-negative number")
    return value


def is_digits(text: str) -> bool:
    """True for a non-empty string of ASCII digits ('²' and '٣' are digits to str.isdigit, not
    to int()).

    >>> is_digits("8080"), is_digits("\u00b2"), is_digits("")
    (True, False, False)
    """
    return isinstance(text, str) and text.isascii() and text.isdigit()


def is_count(value: Any) -> bool:
    """True when `value` is an integer >= 0 (a bool is not)."""
    return _is_int(value) and value >= 0


def port(value: Any) -> bool:
    """True when `value` is a TCP port number (1 to 65535)."""
    return _is_int(value) and 0 < value < 65536
