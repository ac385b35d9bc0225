"""How a user's mistakes read, in one place for every module that words them: pydantic's first error
as one sentence naming the field (with the closest documented key for an unknown one), the value
echo (`shown_value`, `shown_key`: one line, cut at 60 characters), a path named whole on one line
(`shown_path`), and why a path is no file to read (`not_a_file`, `not_a_file_error`,
`not_a_file_mode`: does not exist, is a link to nothing, is a link loop, is a directory, is a pipe
or device, cannot be read)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError


def format_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """The first pydantic error as one sentence naming the field and the fix; for an unknown key
    of `model` (or of a section inside it), the closest documented key ("did you mean")."""
    first = err.errors()[0]
    loc = ".".join(shown_key(part) for part in first["loc"])
    kind, msg = first["type"], first["msg"]
    if kind == "extra_forbidden":
        close = _closest_key(model, first["loc"]) if model is not None else None
        if close is not None:
            return f"{source}: unknown key `{loc}`; did you mean `{close}`?"
        return f"{source}: unknown key `{loc}`; remove it or check its spelling against the documented fields"
    if kind == "missing":
        return f"{source}: `{loc}` is required; add it"
    msg = msg.removeprefix("Value error, ")
    where = f"`{loc}`: " if loc else ""
    # a type or range error echoes the value given; a validator's own sentence already speaks of it
    got = ""
    if loc and kind not in ("value_error", "assertion_error"):
        got = f" ({shown_value(first['input'])})" if ", got " in msg else f", got {shown_value(first['input'])}"
    return f"{source}: {where}{msg}{got}; fix this value"


def not_a_file(path: Path) -> str:
    """Why ``path`` is no file to read, as a phrase ("" for a regular file): see `not_a_file_error`
    (it cannot be looked up) and `not_a_file_mode` (it is something other than a regular file)."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        return not_a_file_error(err, path)
    return not_a_file_mode(mode)


def not_a_file_error(err: OSError, path: Path, fix: str = "") -> str:
    """Why looking up or opening ``path`` failed with ``err``, as a phrase: it does not exist, is a
    link to a missing file (named), is a link loop, or cannot be read (the system's reason: a name
    too long, a permission refused). With ``fix``, the phrase goes on with it ("; check the path"),
    or with "check its permissions" where the system refused access."""
    if err.errno == errno.ELOOP:
        phrase = "is a link loop"
    elif err.errno in (errno.ENOENT, errno.ENOTDIR):
        phrase = _dangling_link(path) or "does not exist"
    else:
        phrase = f"cannot be read ({err.strerror or err})"
    if not fix:
        return phrase
    return f"{phrase}; {'check its permissions' if err.errno in (errno.EACCES, errno.EPERM) else fix}"


def not_a_file_mode(mode: int) -> str:
    """Why a file of ``mode`` (its ``st_mode``) is no file to read, as a phrase ("" for a regular
    file): a directory, or a pipe, socket or device (a FIFO, /dev/zero) that would block or never end."""
    if stat.S_ISREG(mode):
        return ""
    return "is a directory" if stat.S_ISDIR(mode) else "is not a regular file (a pipe, socket or device)"


def _dangling_link(path: Path) -> str:
    """"is a link to '<target>', which does not exist" when ``path`` itself is a symbolic link; ""
    otherwise (then it is the name, or a folder on its way, that is missing)."""
    try:
        target = os.readlink(path)
    except (OSError, ValueError):
        return ""
    return f"is a link to {shown_path(target)}, which does not exist"


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as a sentence names it: quoted, whole (a cut name would name another file), and on one
    line (a newline or another invisible character escaped, as repr writes it)."""
    return repr(os.fspath(path))


def path_exists(path: Path, folder: bool = False) -> bool:
    """``path`` exists (as a folder, with ``folder``); False also for a name the system refuses to
    look up (too long, a link loop), which Path.exists raises for."""
    try:
        return path.is_dir() if folder else path.exists()
    except OSError:
        return False


def shown_key(part: Any) -> str:
    """One step of a field's path in a sentence: a key as written, or (a key holding a newline or
    another invisible character, or a very long one) as its quoted, escaped, shortened repr."""
    try:
        text = str(part)
    except Exception:  # noqa: BLE001 - a key whose str fails is still shown by shown_value
        return shown_value(part)
    return text if text.isprintable() and len(text) <= 60 else shown_value(part)


def shown_value(value: Any, limit: int = 60) -> str:
    """A value the user gave, as an error sentence echoes it: its repr on one line (a string quoted,
    control and invisible characters escaped), cut at `limit` characters; an integer too long for
    that is named by its number of digits (a cut number would read as another number)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 14_000:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"  # repr refuses past 4,300 digits
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named by its type
        text = type(value).__name__
    if type(value) is int and len(text) > limit:
        return f"an integer of {len(text.lstrip('-'))} digits"
    return one_line(text, limit)


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (each run of whitespace, newlines included, one space), cut at ``limit``
    characters with "..." (a parser's or a library's words, which may quote a file)."""
    words = " ".join(str(text).split())
    return words if len(words) <= limit else words[: limit - 3] + "..."


def _closest_key(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The documented key closest to the unknown one at `loc` (its dotted path), if one is close:
    the sections on the way are followed through the models' field types (list indices skipped)."""
    import difflib
    import typing

    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        candidates += [inner for arg in candidates for inner in typing.get_args(arg)]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return None
    match = difflib.get_close_matches(str(loc[-1]), list(current.model_fields), n=1, cutoff=0.6)
    if not match:
        return None
    return ".".join([*(str(p) for p in loc[:-1]), match[0]])
