"""How a trainer config's mistakes read: pydantic's first error as one sentence naming the field
(with the closest documented key for an unknown one, and the value given echoed on one line), and
why a path named in it is no file to read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError


def format_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """The first pydantic error as one sentence naming the field and the fix; for an unknown key
    of `model` (or of a section inside it), the closest documented key ("did you mean")."""
    first = err.errors()[0]
    loc = ".".join(_shown_key(part) for part in first["loc"])
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
    """Why ``path`` is no file to read, as a phrase ("" for a regular file): it does not exist, is a
    directory, a link loop, a name the system refuses (too long), or a pipe or device (a FIFO,
    /dev/zero) that exists but is no problem file."""
    import errno
    import stat

    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a link loop"
        return "does not exist" if err.errno in (errno.ENOENT, errno.ENOTDIR) else f"cannot be read ({err.strerror})"
    if stat.S_ISREG(mode):
        return ""
    return "is a directory" if stat.S_ISDIR(mode) else "is not a regular file (a pipe, socket or device)"


def path_exists(path: Path, folder: bool = False) -> bool:
    """``path`` exists (as a folder, with ``folder``); False also for a name the system refuses to
    look up (too long, a link loop), which Path.exists raises for."""
    try:
        return path.is_dir() if folder else path.exists()
    except OSError:
        return False


def _shown_key(part: Any) -> str:
    """One step of a field's path in a sentence: a key as written, or (a key holding a newline or
    another invisible character, or a very long one) as its quoted, escaped, shortened repr."""
    text = str(part)
    return text if text.isprintable() and len(text) <= 60 else shown_value(part)


def shown_value(value: Any, limit: int = 60) -> str:
    """A value the user gave, as an error sentence echoes it: its repr on one line (a string quoted,
    control and invisible characters escaped), cut at `limit` characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        text = f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"  # repr refuses past 4,300 digits
    else:
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - a value whose repr fails is still named by its type
            text = type(value).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
