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

import os
import secrets

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
