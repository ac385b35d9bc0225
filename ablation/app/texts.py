"""What the command line shows before any work starts: help texts, default values, and the
command lines its hints print. Importable without pydantic, pandas, Ray, MLflow or torch, so that
every `dapo-ablate COMMAND --help` answers at once; the commands import the rest of the app layer
inside their functions (tests/unit/test_cli_startup.py holds both: what `--help` imports, and that
the values copied here equal the ones the layers below check against)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

PROGRAM = "dapo-ablate"

REPORT_FORMATS = ("csv", "md", "tex", "png", "html")
"""`reports.options.FORMATS`: the formats `report --format` accepts (all by default)."""
ADJUSTMENTS = ("holm", "bh", "none")
"""`reports.multiplicity.ADJUSTMENTS`: what `report --adjust` and `plan-seeds --adjust` accept."""

TARGET_HELP = (
    "Experiment or sweep spec YAML, or the folder OUTPUT_DIR/NAME where `run` or `sweep` recorded the spec it ran."
)
SPEC_HELP = (
    "Experiment spec YAML (see examples/factorial.yaml), or the experiment folder OUTPUT_DIR/NAME where "
    "`run` recorded the spec it ran (spec.yaml, overrides applied)."
)
SWEEP_HELP = (
    "Sweep spec YAML (see examples/sweep.yaml), or the sweep's folder OUTPUT_DIR/NAME where `sweep` recorded "
    "the spec it ran (sweep.yaml, overrides applied)."
)
SPEC_OVERRIDES_HELP = (
    "KEY=VALUE overrides of the spec by its dotted paths, e.g. trainer.algorithm.eps_high=0.3 "
    "executor.max_concurrent=1 seeds=[0,1] (values are YAML), validated like the file."
)
SPEC_OVERRIDES_EPILOG = (
    "Overrides: KEY=VALUE after the spec sets the spec's field at that dotted path, as if the file said so "
    "(trainer.algorithm.eps_high=0.3 executor.max_concurrent=1 seeds=[0,1]); values are YAML; an unknown key "
    "or a bad value stops with one sentence (exit 2). Run ids hash each run's factor levels, seed and "
    "non-default trainer config: an override that changes the trainer's config makes new runs (on a "
    "name already run, give a new name=...: a name is bound to its design; give `status`, `report` and `ui` the same overrides, or the experiment folder OUTPUT_DIR/NAME, to reach them); "
    "one that leaves it unchanged (executor.*, tracking.*, a value equal to the file's or the default) keeps "
    "the runs already done; seeds=[0,1] adds seed 1's runs."
)
SWEEP_OVERRIDES_HELP = (
    "KEY=VALUE overrides of the sweep spec by its dotted paths, e.g. n_trials=5 trainer.schedule.total_steps=10 "
    "space.eps_high.high=0.5 (values are YAML), validated like the file."
)
SWEEP_OVERRIDES_EPILOG = (
    "Overrides: KEY=VALUE after the spec sets the sweep spec's field at that dotted path, as if the file said so "
    "(n_trials=40 trainer.schedule.total_steps=10 space.eps_high.high=0.5); values are YAML; an unknown key or a "
    "bad value stops with one sentence (exit 2). Run ids hash each run's non-default trainer config and seed: "
    "runs an override leaves unchanged (n_trials, executor.*, tracking.*) are reused, and the study keeps the "
    "spec's name, so trials run under other overrides stay in it. `sweep` records the spec it ran in the "
    "sweep's folder OUTPUT_DIR/NAME, which `sweep-report` takes in place of the spec and its overrides."
)


def command_line(command: str, target: object, overrides: Sequence[str] = (), *options: str) -> str:
    """A command a hint prints, quoted for a POSIX shell so that it runs as printed:
    ``dapo-ablate report examples/mini.yaml 'seeds=[0, 1]' --out DIR``."""
    words = [PROGRAM, command, str(target), *overrides, *options]
    return " ".join(shlex.quote(word) for word in words)
UNIT_HELP = "in percentage points for an accuracy metric (2 = 2 pp of avg@32), else in the metric's own units"
"""How every accuracy difference a user types reads (`app.units`)."""
