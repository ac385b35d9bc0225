"""Files written whole and never through a link: a fresh temporary file in the target's folder
(a name nobody planted: mkstemp opens it O_EXCL), renamed over the target with os.replace, which
replaces a symbolic link at the target itself instead of writing where it points; and files read
only when they are regular files, never through a link (`read_regular`); folders and lock files
the product owns are never links either (`own_folder`, `open_lock`)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path


def replace_with(path: str | Path, write: Callable[[Path], None]) -> Path:
    """`write(tmp)` fills a fresh temporary file beside `path`, which then becomes `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """`path` holds `text` (UTF-8), written whole, never through a link at `path`."""
    return replace_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def own_folder(path: str | Path) -> Path:
    """`path` as a real folder: a symbolic link planted at its name is removed (never followed; what
    it points to is left alone) and the folder created. For folders the product owns under an output
    folder (an experiment's run folders, a run's folder, the evaluation cache), so that no write into
    them lands outside it."""
    path = Path(path)
    if path.is_symlink():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_lock(path: str | Path) -> int:
    """A descriptor of the lock file `path` (created if absent, never truncated), opened without
    following a link: a link planted at its name is replaced by the lock file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o644)
    except OSError:
        if not Path(path).is_symlink():
            raise
        os.unlink(path)
        return os.open(path, flags, 0o644)


class UnreadableFile(ValueError):
    """A file that is not read because it may be planted; the message says why (a phrase)."""


def read_regular(path: str | Path, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file at `path` (of at most `max_bytes`), opened without following a
    link and without blocking on a FIFO; UnreadableFile (a link, a FIFO, a device, a folder, too
    large, unreadable) otherwise."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise UnreadableFile("it is a symbolic link" if Path(path).is_symlink() else f"it cannot be read ({err.strerror})") from None
    with os.fdopen(handle, "rb") as opened:
        info = os.fstat(opened.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile("it is not a regular file")
        if max_bytes is not None and info.st_size > max_bytes:
            raise UnreadableFile(f"it is larger than {max_bytes // 2**20} MiB")
        return opened.read() if max_bytes is None else opened.read(max_bytes + 1)
