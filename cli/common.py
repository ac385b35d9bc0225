"""What every command shares: a user's mistake is one sentence on stderr and exit status 2."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import typer

from dapo_ablate.ablation.app.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str) -> None:
    """Print a user's mistake as one sentence and exit with status 2."""
    typer.echo(f"error: {message}", err=True)
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
