"""What every command shares: a user's mistake is one sentence on stderr and exit status 2."""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, TypeVar

import typer

from dapo_ablate.ablation.app.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
"""Everything str.splitlines splits on. A user's text quoted in a message (a column name, a metric,
a path) may hold one: it is shown escaped, so the message stays one line whatever the input."""


def one_line(message: str) -> str:
    """``message`` with every line break written as its escape ("a\\nb")."""
    return BREAKS.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), message)


def fail(message: str) -> None:
    """Print a user's mistake as one sentence on one line and exit with status 2."""
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(2)


def user_facing(command: F) -> F:
    """A command whose `UserError` (from the app layer) ends it with that sentence and exit 2."""

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as err:
            fail(str(err))

    return wrapped  # type: ignore[return-value]


def parse_list(text: str | None) -> list[str] | None:
    """``"a, b"`` -> ["a", "b"]; None stays None."""
    if text is None:
        return None
    return [item.strip() for item in text.split(",") if item.strip()]
