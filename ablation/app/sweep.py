"""``sweep | sweep-report``: an Optuna study over the knobs (each trial's runs on the one driver),
its dry-run plan, and its report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dapo_ablate.ablation.app.errors import UserError, check_writable, user_errors
from dapo_ablate.ablation.app.experiment import UiServer, store_ui_server
from dapo_ablate.ablation.app.specs import shown, spec_file
from dapo_ablate.ablation.app.texts import command_line
from dapo_ablate.ablation.experiment.overrides import OverrideError, load_spec_with_overrides
from dapo_ablate.ablation.experiment.spec import SpecError, run_root
from dapo_ablate.ablation.runtime.executor import SWEEP_RECORD
from dapo_ablate.ablation.runtime.preflight import check_contexts, preflight
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.runs_view import RunsView, param_column, pp_tag, tag_column
from dapo_ablate.ablation.store.tracking import metric_name
from dapo_ablate.core.config import ConfigError
from dapo_ablate.core.contracts import metric_text
from dapo_ablate.sweeps.plan import format_sweep_plan
from dapo_ablate.sweeps.report import read_report, write_report
from dapo_ablate.sweeps.report_data import ShownTable, SweepReport, shown_best, shown_trials
from dapo_ablate.sweeps.runner import SweepSummary, run_sweep
from dapo_ablate.sweeps.spec import SweepSpec
from dapo_ablate.sweeps.study import StudyError
from dapo_ablate.sweeps.knobs import format_params

ERRORS = (SpecError, ConfigError, LedgerError, ExecutorError, StudyError, OverrideError)
STUDY_RUN_HINT = "run `dapo-ablate sweep` first"
"""How `sweeps.study` ends "no study yet": the app puts the very command in its place."""


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """The sweep spec at `path` (a YAML file, or the sweep's folder holding the `SWEEP_RECORD` its
    last `sweep` wrote) with its command-line overrides applied."""
    with user_errors(*ERRORS):
        return load_spec_with_overrides(SweepSpec, spec_file(path, SWEEP_RECORD), overrides, kind="sweep")


def report_hint(spec: SweepSpec) -> str:
    """The `sweep-report` command of the sweep, on the folder where `sweep` recorded its spec
    (so it holds whatever overrides the sweep had); DIR stands for the report's folder."""
    return command_line("sweep-report", shown(run_root(spec)), (), "--out", "DIR")


def best_trial_text(spec: SweepSpec, summary: SweepSummary) -> str:
    """The best trial as the closing line shows it: "best trial 2: avg@32 50.0 pp eps_high=0.3"."""
    if summary.best_number is None:
        return "no complete trial"
    knobs = format_params(summary.best_params, summary.knob_digits)
    return f"best trial {summary.best_number}: {metric_text(summary.best_value, spec.metric)} {knobs}"


def sweep_plan(spec: SweepSpec, address: str | None = None, n_trials: int | None = None) -> str:
    """Check the spec's folders, stores and Ray address; the plan `sweep --dry-run` prints."""
    with user_errors(*ERRORS):
        preflight(spec, address if address is not None else spec.executor.address)  # type: ignore[arg-type]
        check_contexts(spec)
    return format_sweep_plan(spec, n_trials)


def sweep(spec: SweepSpec, address: str | None = None, n_trials: int | None = None, progress: bool = True,
          cell_fn: Callable[..., dict[str, Any]] | None = None) -> SweepSummary:
    """Run (or resume) the study until `n_trials` trials have finished (`sweeps.runner`). Raises
    `Interrupted` for a Ctrl-C or SIGTERM before any trial started."""
    with user_errors(*ERRORS):
        return run_sweep(spec, address=address, n_trials=n_trials, cell_fn=cell_fn, progress=progress)


def sweep_report(spec: SweepSpec, out: Path, run_command: str | None = None) -> list[Path]:
    """The study's best parameters, trials, importances and (robustness mode) factor effects,
    written into `out` (CSVs, PNG figures, report.md and sweep_report.html); the paths. `run_command`: the `dapo-ablate sweep` command line of this
    spec, which a study never run is told to run first."""
    report = _read(spec, run_command)
    check_writable(out)
    return write_report(report, out)


def _read(spec: SweepSpec, run_command: str | None, importances: bool = True) -> SweepReport:
    try:
        return read_report(spec, importances)
    except StudyError as error:
        text = str(error)
        if run_command is not None:
            text = text.replace(STUDY_RUN_HINT, f"run `{run_command}` first")
        raise UserError(text) from None
    except ERRORS as error:
        raise UserError(str(error)) from None


@dataclass(frozen=True)
class SweepStatus:
    """Where a sweep stands, as `status` prints it: its trials table and a line of counts and the best."""

    title: str
    trials: ShownTable
    lines: tuple[str, ...]


def sweep_status(spec: SweepSpec, run_command: str) -> SweepStatus:
    """The sweep's trials from its study (each trial's state, value, knob values, time, error),
    the count of trials in each state against `n_trials`, and the best trial so far."""
    report = _read(spec, run_command, importances=False)
    counts = report.trials["state"].str.lower().value_counts()
    lines = ["  ".join(f"{state} {int(n)}" for state, n in counts.items()) + f"  (n_trials {spec.n_trials})"]
    best = shown_best(report).frame
    if len(best):
        row = best.iloc[0]
        knobs = ", ".join(f"{knob}={row[knob]}" for knob in report.knobs)
        lines.append(f"best so far: trial {row['trial']}, {best.columns[1]} {row[best.columns[1]]} ({knobs})")
    lines.append(f"report: {report_hint(spec)}")
    title = f"{spec.name} (sweep, {len(report.trials)} trials)"
    return SweepStatus(title, shown_trials(report), tuple(lines + report.notes))


def sweep_ui_server(spec: SweepSpec, port: int, run_command: str) -> UiServer:
    """The MLflow UI of the sweep's store, its link opening the trials ranked by the metric with
    each knob's value (`ablation.app.experiment.store_ui_server` does the checks)."""
    name = metric_name(spec.metric)
    columns = (tag_column(pp_tag(name)), param_column("trial"), *(param_column(knob) for knob in spec.space))
    view = RunsView(f"dapo-ablate: trials by {spec.metric}", name, columns, {tag_column(pp_tag(name)): 60 + 6 * len(name)}, (name,))
    opens = f"{spec.name}: its trials by {spec.metric}, with each knob's value"
    return store_ui_server(spec.tracking.uri, spec.name, view, opens, run_command, port)
