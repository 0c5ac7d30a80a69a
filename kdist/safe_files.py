"""Files kdist writes (backup manifests, failure records, launch logs and summaries): created
without following a symlink and without widening the process's umask.

A shared directory (a team's scratch space, /tmp) lets another user plant a symlink where kdist
will write, pointing at one of your files. kdist never writes through such a link: a new file is
created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a fresh name, then renamed over the target
(a rename replaces a symlink itself, never the file it points to; in a sticky directory the
kernel refuses to replace another user's entry). Files are created with mode 0666 and folders
with 0777, both reduced by the umask, as the shell would create them; temporary folders are
private (0700).

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> victim = os.path.join(folder, "victim"); _ = open(victim, "w").write("mine")
>>> os.symlink(victim, os.path.join(folder, "summary.json"))
>>> write_text(os.path.join(folder, "summary.json"), "{}")
>>> open(victim).read(), os.path.islink(os.path.join(folder, "summary.json"))
('mine', False)
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def write_text(path: str, text: str, durable: bool = False) -> None:
    """Writes `text` to `path` atomically: a new file beside it, then renamed over it.
    `durable`: fsync the file before the rename."""
    directory = os.path.dirname(os.path.abspath(path))
    incoming = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}")
    fd = os.open(incoming, _NEW, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(incoming, path)
    except BaseException:
        if os.path.lexists(incoming):
            os.unlink(incoming)
        raise


def open_for_append(path: str):
    """`path` opened to append text, created if missing; a symlink there is removed first (a
    planted link is never written through)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
    if os.path.islink(path):
        os.unlink(path)
    return os.fdopen(os.open(path, flags, 0o666), "a", encoding="utf-8", errors="replace")


@contextlib.contextmanager
def replaced_whole(path: str):
    """Yields a new path beside `path`, ending as `path` ends (Keras checks the extension), for
    one writer to fill with a file or a folder. When the block ends it replaces `path`; when the
    block fails it is removed and `path` is as it was. A full disk raises an OSError that names
    `path` and the space left. A `path` whose folder does not exist is yielded as it is (the
    writer's own error names it)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        yield path
        return
    name = os.path.basename(os.path.normpath(path))
    incoming = os.path.join(directory, f".kdist-{secrets.token_hex(6)}-{name}")
    try:
        yield incoming
        _replace(incoming, path)
    except BaseException as err:
        _remove(incoming)
        if _disk_full(err):
            raise _full(path, directory) from err
        raise


def room_for(path: str, nbytes: int) -> None:
    """Raises the full disk's OSError (naming `path` and the space left) unless the disk that
    holds `path` (a file, or a folder to write in) has `nbytes` free: checked before a writer
    that cannot fail cleanly (h5py, which can crash the process at exit after a failed write)
    starts."""
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if os.path.isdir(directory) and shutil.disk_usage(directory).free < nbytes:
        raise _full(path, directory, f"; it needs about {nbytes / 2**20:.1f} MiB")


def _full(path: str, directory: str, need: str = "") -> OSError:
    free = shutil.disk_usage(directory).free / 2**20
    return OSError(errno.ENOSPC, f"no space left to write {path} ({free:.1f} MiB free on its "
                                 f"disk{need}); what was there is unchanged: free some space or "
                                 "write elsewhere")


def _replace(incoming: str, path: str) -> None:
    """Renames `incoming` over `path`. A file replaces a file in one step; a folder cannot be
    renamed over a folder that is not empty, so that one is moved aside first, and again if
    another writer (a worker saving the same path at once) put its own there meanwhile."""
    if not os.path.isdir(incoming):
        os.replace(incoming, path)
        return
    for _ in range(16):
        try:
            os.rename(incoming, path)
            return
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
        aside = f"{incoming}-replaced"
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rename(path, aside)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.unlink(path)  # a file or a link where the folder goes
        except FileNotFoundError:
            pass  # another writer moved it first
    raise OSError(errno.EBUSY, f"{path} kept changing while kdist replaced it: more writers "
                               "than expected save to it at once")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _disk_full(err: BaseException) -> bool:
    """h5py and TensorFlow report a full disk in their own exception types, with errno 28 in the
    text; the cause chain is searched too."""
    for _ in range(8):  # a chain, never a cycle, but bounded all the same
        if err is None:
            return False
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left" in str(err) \
                or "errno = 28" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False
