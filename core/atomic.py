"""Files written whole and never through a link: a fresh temporary file in the target's folder
(a name nobody planted: mkstemp opens it O_EXCL), renamed over the target with os.replace, which
replaces a symbolic link at the target itself instead of writing where it points; and files read
only when they are regular files, never through a link (`read_regular`)."""

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
