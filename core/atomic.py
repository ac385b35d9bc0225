"""Files written whole and never through a link: a fresh temporary file in the target's folder
(a name nobody planted: mkstemp opens it O_EXCL), renamed over the target with os.replace, which
replaces a symbolic link at the target itself instead of writing where it points."""

from __future__ import annotations

import os
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
