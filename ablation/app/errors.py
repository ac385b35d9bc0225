"""The one error the CLI maps to exit status 2: a user's mistake, as one sentence."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dapo_ablate.ablation.runtime.signals import Interrupted  # noqa: F401 - a stop before any run started (exit 130 / 143)


class UserError(Exception):
    """A mistake the user fixes (a bad spec, an unreachable store, a folder that cannot be
    written), as one sentence naming the field or file and the fix."""


@contextmanager
def user_errors(*kinds: type[BaseException]) -> Iterator[None]:
    """Within the block, an error of one of `kinds` (each layer's own user-error classes) becomes
    a `UserError` with the same sentence."""
    try:
        yield
    except kinds as err:
        raise UserError(str(err)) from None


def check_writable(out: Path) -> None:
    """Refuse an output folder that cannot be created or written, before any work starts."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"output folder {str(out)!r} is not writable ({err.strerror}); choose another --out") from None
