"""A spec's mistakes: `SpecProblem` inside its validators (the field and the fix), `SpecError`
for the user (one sentence), and `format_spec_error` between them."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from dapo_ablate.core.config_errors import format_validation_error


class SpecError(ValueError):
    """A user's mistake in an experiment spec; the message is one sentence naming the field and the fix."""


class SpecProblem(ValueError):
    """Raised inside a spec's validators (experiment and sweep alike): a message that already says
    the fix, and the field it is about; `format_spec_error` turns it into the user's sentence.

    With field=None the message is a complete sentence of its own (a trainer file's error)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message, self.field = message, field

    def sentence(self, source: str) -> str:
        return f"{source}: `{self.field}`: {self.message}" if self.field else self.message


def format_spec_error(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """The first validation error as one sentence, in core.config's `format_validation_error` style
    ("did you mean" for an unknown key of `model`)."""
    problem = (err.errors()[0].get("ctx") or {}).get("error")
    if isinstance(problem, SpecProblem):
        return problem.sentence(source)
    return format_validation_error(err, source, model)
