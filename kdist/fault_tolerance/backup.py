"""A backup that cannot lie: one atomic, self-describing unit per save, verified before a restore.

Each save writes a new *generation* of ``backup_dir``::

    backup_dir/generation-000007/model.weights.h5   the model's and optimizer's variables
    backup_dir/generation-000007/manifest.json      what the unit holds (below)

The generation is written under a temporary name inside ``backup_dir`` and renamed when complete
(a killed save leaves no generation behind), and the last two generations are kept. The manifest
holds the SHA-256 and size of every file, the architecture (every variable's path, shape and dtype,
and their fingerprint), the position (epoch, step, examples) and the world (global batch, replicas,
workers) that wrote it.

`latest(backup_dir, model)` verifies all of it before anything touches the model:

- the newest generation verifies: it is the one to restore;
- it does not (a file missing, truncated, overwritten; the manifest missing or unreadable) and the
  previous one does: a warning names both paths, and the previous one is restored;
- the architecture differs from the model's: `BackupError` (falling back would not help);
- nothing verifies, or the directory holds a backup without a manifest (Keras's own format):
  `BackupError`, naming the path, what is wrong and the fix. Never a silent partial restore.

>>> import keras, tempfile
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> model.compile("adam", "mse")
>>> folder = tempfile.mkdtemp()
>>> path = write(folder, model, {"epoch": 1, "step": 0})
>>> latest(folder, model).position
{'epoch': 1, 'step': 0}
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile

from kdist import safe_files
from kdist.keras_seam import saving

logger = logging.getLogger("kdist")

FORMAT = "kdist-backup/1"
MANIFEST = "manifest.json"
WEIGHTS = "model.weights.h5"
KEEP = 2  # generations kept: the newest and the previous good one
_GENERATION = re.compile(r"generation-(\d{6,})$")
_POSITION = ("epoch", "step", "examples")
_WORLD = ("global_batch", "replicas", "workers")


class BackupError(RuntimeError):
    """A backup that cannot be restored as saved: names the path, what is wrong and the fix."""

    def __init__(self, path: str, problem: str, fix: str):
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"backup {path}: {problem}. Fix: {fix}")


class Unit:
    """One verified generation: its path and manifest."""

    def __init__(self, path: str, manifest: dict):
        self.path, self.manifest = path, manifest

    @property
    def weights(self) -> str:
        return os.path.join(self.path, WEIGHTS)

    @property
    def position(self) -> dict:
        """Where training stood when it was written: epoch and step (and examples, if known)."""
        return {k: self.manifest[k] for k in _POSITION if self.manifest.get(k) is not None}

    @property
    def metadata(self) -> dict:
        """The position and the world that wrote it (`kdist.fault_tolerance.elastic.resume_plan`
        reads it)."""
        return {k: self.manifest[k] for k in _POSITION + _WORLD if self.manifest.get(k) is not None}

    def restore(self, model) -> None:
        """Loads the verified variables into `model` (and its optimizer)."""
        model.load_weights(self.weights)


# ------------------------------------------------------------------ architecture
def architecture(model) -> list[list]:
    """[path, shape, dtype] of every variable a backup of `model` holds (the model's, then its
    optimizer's), building the optimizer first as a restore must."""
    optimizer = model.optimizer
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    variables = list(model.weights) + (list(optimizer.variables) if optimizer is not None else [])
    return [[v.path, [int(d) for d in v.shape], str(v.dtype)] for v in variables]


def fingerprint(variables: list[list]) -> str:
    """The architecture's hash: every variable's shape and dtype, in order. Paths are left out:
    Keras numbers its layers per process (dense_4 in a process that built four before), and
    `load_weights` matches variables by position."""
    layout = [[shape, dtype] for _, shape, dtype in variables]
    return hashlib.sha256(json.dumps(layout, separators=(",", ":")).encode()).hexdigest()


# ------------------------------------------------------------------ files
def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: str, content: dict) -> None:
    """Writes `content` to `path` atomically and durably (never through a symlink there)."""
    safe_files.write_text(path, json.dumps(content, indent=1, sort_keys=True), durable=True)


def generations(directory: str) -> list[str]:
    """The generation folders of `directory`, newest first; a symlink is never one (in a shared
    directory another user could plant one pointing at weights of their choosing)."""
    if not os.path.isdir(directory):
        return []
    numbered = [(int(m.group(1)), name) for name in os.listdir(directory)
                if (m := _GENERATION.match(name))
                and not os.path.islink(os.path.join(directory, name))]
    return [os.path.join(directory, name) for _, name in sorted(numbered, reverse=True)]


# ------------------------------------------------------------------ write
def write_unit(folder: str, model, metadata: dict, save=None) -> None:
    """Writes `model`'s variables and their manifest into the existing `folder`. `metadata`: epoch,
    step, examples, global_batch, replicas, workers; `save(path)` writes the weights file (default:
    `model.save_weights`)."""
    import keras

    weights = os.path.join(folder, WEIGHTS)
    with saving.as_given():  # `folder` is new and renamed into place by the caller
        (save or model.save_weights)(weights)
    _fsync(weights)
    variables = architecture(model)
    _write_json(os.path.join(folder, MANIFEST), {
        "format": FORMAT, "keras": keras.__version__,
        "files": {WEIGHTS: {"sha256": sha256(weights), "bytes": os.path.getsize(weights)}},
        "fingerprint": fingerprint(variables), "variables": variables,
        **{k: metadata.get(k) for k in _POSITION + _WORLD}})


def write(directory: str, model, metadata: dict, save=None) -> str:
    """Saves `model` as a new generation of `directory` (`write_unit`), renamed into place once
    complete; keeps the newest `KEEP` generations; returns the new one's path."""
    os.makedirs(directory, exist_ok=True)
    for stale in (n for n in os.listdir(directory) if n.startswith(".incoming-")):
        shutil.rmtree(os.path.join(directory, stale), ignore_errors=True)  # a killed save's
    safe_files.room_for(directory, saving.bytes_needed(model))
    newest = generations(directory)
    number = int(_GENERATION.search(newest[0]).group(1)) + 1 if newest else 0
    incoming = tempfile.mkdtemp(prefix=".incoming-", dir=directory)
    try:
        write_unit(incoming, model, metadata, save)
        final = os.path.join(directory, f"generation-{number:06d}")
        os.rename(incoming, final)
        _fsync(directory)
    except BaseException:
        shutil.rmtree(incoming, ignore_errors=True)
        raise
    for old in generations(directory)[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def update_position(unit_path: str, epoch: int, step: int) -> None:
    """Moves the position a generation records (its variables unchanged), atomically: a backup
    saved at an epoch's last step holds the whole epoch, so it resumes at the next one."""
    manifest_path = os.path.join(unit_path, MANIFEST)
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    manifest.update(epoch=epoch, step=step, examples=0)
    _write_json(manifest_path, manifest)


# ------------------------------------------------------------------ verify and choose
_DAMAGED_FIX = ("the backup is damaged and no earlier generation verifies: restore {dir} from a "
                "copy, or delete it to train from the start")


def verify(path: str, expected: list[list] | None = None) -> Unit:
    """The generation at `path`, checked file by file against its manifest (and, with
    `expected`, against a model's architecture); `BackupError` naming what is wrong otherwise."""
    directory = os.path.dirname(path)
    manifest_path = os.path.join(path, MANIFEST)
    fix = _DAMAGED_FIX.format(dir=directory)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise BackupError(path, f"{MANIFEST} is missing", fix) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BackupError(path, f"{MANIFEST} is unreadable ({err})", fix) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or \
            not isinstance(manifest.get("files"), dict):
        raise BackupError(path, f"{MANIFEST} is not a {FORMAT} manifest", fix)
    for name, entry in manifest["files"].items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise BackupError(path, f"{name} is missing", fix)
        size = os.path.getsize(file)
        if not isinstance(entry, dict) or size != entry.get("bytes"):
            raise BackupError(path, f"{name} has {size} bytes, the manifest says "
                                    f"{entry.get('bytes') if isinstance(entry, dict) else '?'}",
                              fix)
        if sha256(file) != entry.get("sha256"):
            raise BackupError(path, f"{name} differs from what was saved (SHA-256 mismatch)", fix)
    if expected is not None and manifest.get("fingerprint") != fingerprint(expected):
        raise _ArchitectureError(path, _first_difference(manifest.get("variables") or [],
                                                         expected), directory)
    return Unit(path, manifest)


class _ArchitectureError(BackupError):
    def __init__(self, path: str, difference: str, directory: str):
        super().__init__(path, f"it was written by another model: {difference}",
                         f"build the same model (and optimizer) as the run that wrote it, or "
                         f"give this model another backup_dir than {directory}")


def _first_difference(saved: list, model: list) -> str:
    """The first variable, by position, whose shape or dtype differs (or that one side lacks)."""
    for position, (path, shape, dtype) in enumerate(model):
        if position >= len(saved):
            return (f"the backup holds {len(saved)} variables and this model more, from "
                    f"{path} {tuple(shape)}")
        entry = saved[position]
        saved_shape, saved_dtype = (entry[1], entry[2]) if isinstance(entry, list) and \
            len(entry) == 3 else (None, None)
        if [saved_shape, saved_dtype] != [shape, dtype]:
            return (f"variable {position} ({path} here) is "
                    f"{tuple(saved_shape or ())} {saved_dtype} in the backup and "
                    f"{tuple(shape)} {dtype} in this model")
    return (f"the backup holds {len(saved)} variables and this model {len(model)}"
            if len(saved) != len(model) else "its variables differ")


def latest(directory: str, model) -> Unit | None:
    """The newest generation of `directory` that verifies for `model` (see the module docstring);
    None when there is no backup at all."""
    found = generations(directory)
    if not found:
        _refuse_foreign_backup(directory)
        return None
    expected = architecture(model)
    failures = []
    for path in found:
        try:
            unit = verify(path, expected)
        except _ArchitectureError:
            raise
        except BackupError as err:
            failures.append(err)
            continue
        if failures:
            logger.warning("kdist: backup %s cannot be restored (%s); restoring the previous "
                           "generation %s instead", failures[0].path, failures[0].problem, path)
        return unit
    raise failures[0]


def _refuse_foreign_backup(directory: str) -> None:
    """A directory holding a backup without a manifest (Keras's own `BackupAndRestore` format)
    cannot be verified: refuse it rather than restore it unchecked."""
    if not os.path.isdir(directory):
        return
    foreign = sorted(name for name in os.listdir(directory)
                     if name.endswith((".weights.h5", "training_metadata.json")))
    if foreign:
        raise BackupError(directory, f"holds {', '.join(foreign)} without a kdist manifest (a "
                                     "backup of Keras's own BackupAndRestore), which kdist cannot "
                                     "verify", "move it away to train from the start, or resume "
                                     "it with the Keras that wrote it")
