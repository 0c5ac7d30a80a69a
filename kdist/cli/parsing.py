"""What every command of the command line shares: the parser (errors in kdist's one-line form),
the argument types, and the checks of the files a command writes.

>>> count("3"), seconds("2.5")
(3, 2.5)
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

from kdist import exit_codes, safe_files, validators
from kdist.cluster.spec import ClusterSpecError


class Parser(argparse.ArgumentParser):
    """argparse, with its errors after the command's usage, in kdist's one-line form, exit code 2;
    it keeps its own list of its options and choices (for "did you mean") and its subcommands."""

    def __init__(self, *args, **kwargs):
        self.known_words: list[str] = []  # option strings and string choices
        self.subcommands = None  # the action add_subparsers returned
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.known_words += [*action.option_strings,
                             *(c for c in (action.choices or ()) if isinstance(c, str))]
        return action

    def add_subparsers(self, **kwargs):
        self.subcommands = super().add_subparsers(parser_class=Parser, **kwargs)
        return self.subcommands

    def error(self, message):
        flag, sep, problem = message.removeprefix("argument ").partition(": ")
        if not message.startswith("argument ") or not sep:
            flag, problem = self.prog, message
        self.print_usage(sys.stderr)
        sys.stderr.write(f"kdist: error: {flag}: {problem}{self._did_you_mean(problem)}. "
                         f"Fix: see '{self.prog} --help'\n")
        sys.exit(exit_codes.USAGE)

    def _did_you_mean(self, problem: str) -> str:
        """`; did you mean --workers?` for a misspelt option or subcommand."""
        import difflib

        words = re.findall(r"'([^']+)'|(--?[\w-]+)", problem.partition("(choose from")[0])
        known = self.known_words + list(self.subcommands.choices if self.subcommands else ())
        for word in (w for pair in words for w in pair if w):
            close = difflib.get_close_matches(word, known, n=1, cutoff=0.7)
            if close and close[0] != word:
                return f" (did you mean {close[0]}?)"
        return ""


def number(kind, minimum: float, inclusive: bool, what: str):
    """An argparse type: a finite `kind` >= (or >) `minimum`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; use {what}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; use {what}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


count = number(int, 0, True, "a non-negative integer")
positive_count = number(int, 1, True, "a positive integer")
seconds = number(float, 0, False, "a positive number of seconds")
grace_seconds = number(float, 0, True, "a non-negative number of seconds")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def namespace(text: str) -> str:
    if not _NAMESPACE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Kubernetes namespace; use lower-case "
                                         "letters, digits and '-' (at most 63)")
    return text


def after_dashes(command: list[str]) -> list[str]:
    return command[1:] if command[:1] == ["--"] else command


def task(text: str) -> tuple[str, int]:
    """'worker:1' -> ('worker', 1)."""
    task_type, sep, index = text.partition(":")
    if not sep or not validators.is_digits(index):
        raise ClusterSpecError("--task", f"{text!r} is not TYPE:INDEX", "write e.g. --task worker:1")
    return task_type, int(index)


def output_file(path: str | None, flag: str) -> None:
    """Checks, before any work, that `path` can be written (its directory exists, is writable,
    and it is a plain file or nothing yet: never a symlink, which a shared directory's other
    users could have planted, nor a device or a kernel file)."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ClusterSpecError(flag, f"{path!r} is a directory", "give a file name")
    if os.path.islink(path):
        raise ClusterSpecError(flag, f"{path!r} is a symlink, which kdist does not write through",
                               "give the file's real path")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ClusterSpecError(flag, f"{path!r} is not a regular file", "give a file's path")
    if not os.path.isdir(directory):
        raise ClusterSpecError(flag, f"directory {directory!r} does not exist",
                               "create it first, or write elsewhere")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ClusterSpecError(flag, f"{path!r} is not writable", "write to a writable location")


def write(path: str, text: str, flag: str) -> None:
    """Writes `text` to `path` (checked by `output_file`); an error the system reports only
    then (a full disk, a kernel file) is one line naming the flag."""
    try:
        safe_files.write_text(path, text)
    except OSError as err:
        raise ClusterSpecError(flag, f"{path!r} cannot be written ({err.strerror or err})",
                               "write to a regular file in a writable directory") from None
