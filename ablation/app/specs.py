"""Which experiment a command means: a spec file with its command-line overrides, or the folder
OUTPUT_DIR/NAME where `run` recorded the spec it ran (`runtime.executor.record_spec`); and, when
a spec names none of the runs its folder's record does, the commands that reach them.

A run id hashes the trainer config, so `run SPEC trainer.schedule.total_steps=8` trains other
runs than `run SPEC`: `status SPEC` then shows every run as new and `report SPEC` finds no
finished run. That is right (the plain spec names runs nobody trained), so those commands keep
saying so, and add how to reach the runs that were trained: the same overrides, or the folder.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dapo_ablate.ablation.app.errors import UserError, user_errors
from dapo_ablate.ablation.app.texts import command_line
from dapo_ablate.ablation.experiment.design import Plan
from dapo_ablate.ablation.experiment.fractions import DesignError
from dapo_ablate.ablation.experiment.overrides import OverrideError, load_spec_with_overrides
from dapo_ablate.ablation.experiment.spec import ExperimentSpec, SpecError, load_spec_file, run_root
from dapo_ablate.ablation.runtime.executor import SPEC_RECORD, SWEEP_RECORD, located, repair_record
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.results import ResultsError, spec_plan, status_rows
from dapo_ablate.core.config import ConfigError
from dapo_ablate.core.yamlio import YAMLFileError, read_yaml_mapping

ERRORS = (SpecError, ConfigError, DesignError, OverrideError)
MAX_SHOWN_OVERRIDES = 6
"""A recorded spec that differs in more fields than this is reached through its folder only."""


@dataclass(frozen=True)
class Experiment:
    """A spec file with its overrides applied, and its plan."""

    spec: ExperimentSpec
    plan: Plan
    path: Path
    """The spec file, or the experiment folder, as the user gave it (hints name it)."""
    overrides: tuple[str, ...] = ()
    """The command line's KEY=VALUE overrides, as given (hints repeat them)."""

    def command(self, name: str, *options: str) -> str:
        """The command `name` on this very experiment, as a hint prints it (runs as printed)."""
        return command_line(name, self.path, self.overrides, *options)


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """The spec at `path` (a YAML file, or an experiment folder holding the `SPEC_RECORD` its
    last `run` wrote) with `overrides` (KEY=VALUE by dotted path) applied, and its plan. A folder's
    record that an earlier version's refused `run` rewrote is restored first (`repair_record`; a
    note on stderr says so)."""
    if Path(path).is_dir() and (Path(path) / SPEC_RECORD).is_file():
        repaired = repair_record(Path(path))  # a record an earlier version's refused `run` rewrote
        if repaired:
            print(f"note: {repaired}", file=sys.stderr, flush=True)
    with user_errors(*ERRORS):
        spec = load_spec_with_overrides(ExperimentSpec, spec_file(path, SPEC_RECORD), overrides, kind="spec")
    with user_errors(*ERRORS, LedgerError):
        return Experiment(spec, spec_plan(spec), Path(path), tuple(overrides or ()))


def names_a_sweep(path: str | Path) -> bool:
    """Whether `path` is a sweep's folder (its `SWEEP_RECORD`, no experiment's record) or a sweep
    spec file (a top-level `space:`); a path that does not read is left to the experiment's loader,
    which says why in one sentence."""
    path = Path(path)
    if path.is_dir():
        return (path / SWEEP_RECORD).is_file() and not (path / SPEC_RECORD).is_file()
    try:
        return "space" in read_yaml_mapping(path, "spec")
    except YAMLFileError:
        return False


def spec_file(path: str | Path, record: str) -> Path:
    """`path` itself, or for a folder the spec recorded in it (`record`: `SPEC_RECORD` for an
    experiment, `SWEEP_RECORD` for a sweep); a folder without it is one sentence, naming the
    command that reads the other kind, or the experiment folders inside it."""
    path = Path(path)
    if not path.is_dir():
        return path
    if (path / record).is_file():
        return path / record
    sweep = record == SWEEP_RECORD
    if (path / (SPEC_RECORD if sweep else SWEEP_RECORD)).is_file():
        kind, command = ("an experiment", "report") if sweep else ("a sweep", "sweep-report")
        raise UserError(f"{path} is the folder of {kind}, not of {'a sweep' if sweep else 'an experiment'}; "
                        f"report it with `{command_line(command, path, (), '--out', 'DIR')}`")
    try:
        inside = sorted(shown(folder) for folder in path.iterdir() if (folder / record).is_file())[:5]
    except OSError:  # an unreadable folder: no list
        inside = []
    where = f"; {'sweep' if sweep else 'experiment'} folders in it: {', '.join(inside)}" if inside else ""
    raise UserError(
        f"{path} is a folder without {record}; give the {'sweep' if sweep else 'experiment'} spec YAML, or the "
        f"folder OUTPUT_DIR/NAME where `dapo-ablate {'sweep' if sweep else 'run'}` recorded the spec it ran{where}"
    )


def shown(path: Path) -> str:
    """A path as a hint prints it: relative to the current folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------ the runs a spec does not name
def other_runs_hint(experiment: Experiment, command: str, *options: str) -> str | None:
    """When the experiment's folder records a spec (its last `run`) whose plan is not this one's,
    the sentence that says so and gives the two commands reaching those runs: `command` on the
    folder, and on this spec with the overrides that make the difference; None otherwise."""
    folder = run_root(experiment.spec)
    recorded = _recorded_spec(folder / SPEC_RECORD, experiment)
    if recorded is None:
        return None
    differences = _differences(located(experiment.spec.to_dict()), located(recorded.to_dict()))
    try:
        plan = spec_plan(recorded)
    except LedgerError:
        return None
    if not differences or {run.run_id for run in plan.runs} == {run.run_id for run in experiment.plan.runs}:
        return None
    try:
        done = status_rows(recorded, plan)[1].get("done", 0)
    except (ResultsError, LedgerError):
        return None
    reach = [f"`{command_line(command, shown(folder), (), *options)}`"]
    overrides = [f"{key}={_yaml_value(value)}" for key, value in differences.items()]
    if len(overrides) <= MAX_SHOWN_OVERRIDES:
        # the user's own overrides stay (a `name=` above all: without it the command names another
        # experiment), those of a key that differs replaced by the recorded value
        kept = [given for given in experiment.overrides if _override_key(given) not in differences]
        reach.append(f"`{command_line(command, experiment.path, [*kept, *overrides], *options)}`")
    return (f"its last `run` ({shown(folder / SPEC_RECORD)}, {done} of {len(plan.runs)} runs done) had "
            f"{', '.join(overrides[:MAX_SHOWN_OVERRIDES])}{', ...' if len(overrides) > MAX_SHOWN_OVERRIDES else ''}, "
            f"which names other runs (a run id hashes the trainer config); reach them with {' or '.join(reach)}")


def _recorded_spec(record: Path, experiment: Experiment) -> ExperimentSpec | None:
    """The spec recorded in `record`, unless the experiment was read from that very file, or it
    no longer loads (a record written by another version)."""
    if not record.is_file() or experiment.path.resolve() in (record.resolve(), record.parent.resolve()):
        return None
    try:
        recorded = load_spec_file(ExperimentSpec, record, kind="spec")
    except (SpecError, ConfigError):
        return None
    return recorded if recorded.name == experiment.spec.name else None


def _differences(mine: dict[str, Any], theirs: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted path -> the value `theirs` has where it differs from `mine` (mappings compared key
    by key, anything else as a whole)."""
    found: dict[str, Any] = {}
    for key, value in theirs.items():
        path, own = f"{prefix}{key}", mine.get(key)
        if isinstance(value, dict) and isinstance(own, dict):
            found |= _differences(own, value, path + ".")
        elif own != value:
            found[path] = value
    return found


def _override_key(override: str) -> str:
    """The dotted key a KEY=VALUE override sets (Hydra's ``+``, ``++`` and ``~`` prefixes removed)."""
    return override.split("=", 1)[0].lstrip("+~")


def _yaml_value(value: Any) -> str:
    """A value as an override writes it: YAML flow style, read back as the same value."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1]
