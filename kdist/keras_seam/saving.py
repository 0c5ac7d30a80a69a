"""The files a model writes itself (`save`, `save_weights`, `export`): written whole, from
any number of workers at once.

Every worker of a MultiWorkerMirrored program runs the user's `model.save_weights("m.weights.h5")`.
Without kdist, workers that write one path at once collide: HDF5 refuses the second ("unable to
lock file") and that worker dies, and a `.keras` file or a SavedModel is written twice over itself
(no upstream report found; tf-keras's guide told users to pick the paths by hand). A process killed
in the middle, or a full disk, leaves a truncated file that `load_model` rejects, in place of the
last good one. The fix, on Keras's Model so that the user's calls work unchanged: every process
writes a new name beside the path and renames it over the path once complete. The path then holds
one whole file: the previous one, or one worker's new one (the workers' weights are the same, so
their files are too). Per-worker paths (the tf-keras guide's pattern) are written as given. A disk
without room for the save (checked first: h5py can crash the process at exit after a failed write)
or one that fills meanwhile raises an OSError naming the path and the space left.

Left to Keras as they are: file objects, URLs (`gs://...`), `overwrite=False` over an existing
file (Keras asks), and sharded weights (`max_shard_size`: several files). kdist's own saves,
whose folders are already private or already renamed into place, write where they say
(`as_given`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os

from kdist import safe_files
from kdist.keras_seam.registry import Target

_AS_GIVEN = contextvars.ContextVar("kdist_save_as_given", default=False)


@contextlib.contextmanager
def as_given():
    """Inside the block a model's saves write exactly the path they are given, on every worker."""
    token = _AS_GIVEN.set(True)
    try:
        yield
    finally:
        _AS_GIVEN.reset(token)


def bytes_needed(model) -> int:
    """About what a save of `model` takes on disk: its variables, the optimizer's included, and
    a margin for the file's structure and configuration."""
    import numpy as np

    total = 0
    variables = [*model.weights, *getattr(getattr(model, "optimizer", None), "variables", [])]
    for variable in variables:
        try:
            size = np.dtype(str(variable.dtype)).itemsize
        except TypeError:  # bfloat16 and other types NumPy does not name
            size = 4
        total += int(np.prod(variable.shape)) * size
    return int(total * 1.1) + (64 << 10)


def _local_path(filepath) -> str | None:
    if not isinstance(filepath, (str, os.PathLike)):
        return None
    path = os.fspath(filepath)
    return None if "://" in path else path


def _whole(path: str, args: tuple, kwargs: dict, method: str) -> bool:
    """Whether the save can go to a new name renamed over `path`."""
    if method == "save_weights" and kwargs.get("max_shard_size") is not None:
        return False
    overwrite = kwargs.get("overwrite", args[0] if args and method != "export" else True)
    return overwrite or not os.path.lexists(path)


def _written_whole(original):
    method_name = original.__name__

    @functools.wraps(original)
    def method(self, filepath, *args, **kwargs):
        path = _local_path(filepath)
        if path is None or _AS_GIVEN.get() or not _whole(path, args, kwargs, method_name):
            return original(self, filepath, *args, **kwargs)
        safe_files.room_for(path, bytes_needed(self))
        with safe_files.replaced_whole(path) as incoming:
            return original(self, incoming, *args, **kwargs)

    return method


MODEL_FILES = {Target("Model", name): _written_whole for name in ("save", "save_weights", "export")}
