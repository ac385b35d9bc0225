"""``report``: the causal-isolation report of an experiment (from its ledger) or of a results CSV,
attached to the experiment's MLflow parent run with its headline; and the headline alone, as
`run` puts it on the parent run when every run is done."""

from __future__ import annotations

import os
import shutil
import tempfile

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import pandas as pd
import yaml

from dapo_ablate.ablation.app.errors import UserError, user_errors
from dapo_ablate.ablation.app.provenance import experiment_provenance, held_on, results_provenance
from dapo_ablate.ablation.app.units import metric_units
from dapo_ablate.ablation.app.specs import ERRORS as SPEC_ERRORS
from dapo_ablate.ablation.app.specs import Experiment, load_experiment, other_runs_hint
from dapo_ablate.ablation.experiment.design import Plan
from dapo_ablate.ablation.experiment.spec import EVAL_CACHE_FOLDER, ExperimentSpec, load_spec, run_root
from dapo_ablate.ablation.runtime.executor import record_data
from dapo_ablate.ablation.store.adaptive_state import adaptive_state
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.results import (
    ParentRunLogger,
    ResultsError,
    experiment_tables,
    load_experiment_results,
    open_ledger,
    planned_records,
)
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.tracking import Tracker, check_server_reachable, default_artifact_location, store_errors
from dapo_ablate.ablation.store.transient import MLFLOW, retry_transient
from dapo_ablate.core.contracts import DEFAULT_METRIC, FactorInfo
from dapo_ablate.reports import ReportInputError, ReportOptions, load_results_csv
from dapo_ablate.reports.answer import Answer, experiment_answer, log_answer

ERRORS = (ReportInputError, ResultsError, LedgerError, ExecutorError, *SPEC_ERRORS)
STORE_RUN_HINT = "run `dapo-ablate run` on the spec of {name!r} first"
"""How `store.results` ends "no results yet": the app puts the very command in its place."""


@dataclass(frozen=True)
class ReportRequest:
    """One report: of the experiment spec `spec` (its ledger's finished runs; a spec file with its
    command-line `overrides`, or the experiment folder its `run` recorded the spec in), or of the
    results CSV `results`; written into `out`. `metric` None: the spec's, else avg@32; `factors`
    None: the spec's, else the CSV's 0/1 columns; `options.design` None: the spec's design."""

    out: Path
    spec: Path | None = None
    results: Path | None = None
    metric: str | None = None
    factors: list[str] | None = None
    options: ReportOptions = field(default_factory=ReportOptions)
    overrides: list[str] | None = None
    margin: float | None = None
    """--equivalence-margin as typed: pp for an accuracy metric (`units`); None: the options' own."""
    predictions: Path | None = None
    """--predictions: another report's predictions.yaml to confirm; None: the spec's `confirm:`, if any."""


@dataclass(frozen=True)
class ReportOutcome:
    written: dict[str, Path]
    out: Path

    def claims_line(self) -> str:
        """What claims.csv holds, for the console (a header-only file reads as "nothing supported", not as empty)."""
        path = self.written.get("claims.csv")
        if path is None or not path.exists():
            return ""
        rows = len(pd.read_csv(path))
        if not rows:
            return "claims.csv: header only: nothing is supported by the data"
        return (f"claims.csv: {rows} claim{'s' if rows > 1 else ''}, one row per sentence of the summary's \"Supported by "
                "the data\" (values as fractions, units.csv)")


def report(request: ReportRequest) -> ReportOutcome:
    """Write the report's files; with a spec, attach them and the headline to the experiment's
    MLflow parent run."""
    from dapo_ablate.reports import write_report  # the page and its figures (matplotlib) load only here, not for `run`'s answer

    with user_errors(*ERRORS):
        record = None
        if request.results is not None:
            metric = request.metric or DEFAULT_METRIC
            table, factors = load_results_csv(request.results, request.factors, metric)
            options = replace(request.options, metric=metric, provenance=results_provenance(request.results, len(table)),
                              predictions=_path_text(request.predictions))
            logger, extra, name = None, {}, ""
        else:
            experiment = load_experiment(request.spec, request.overrides)
            spec, plan = experiment.spec, experiment.plan
            table, factors, curves, design, logger = experiment_results(experiment)
            refuse_other_runs(experiment, len(table), request.out)
            refuse_own_folders(spec, request.out)
            if getattr(logger, "tracking_uri", None):  # before any work: MLflow's client retries an absent server for minutes
                check_server_reachable(logger.tracking_uri)
            provenance = experiment_provenance(experiment, len(table), getattr(logger, "parent_run_id", None))
            options = replace(request.options, metric=request.metric or spec.metric, design=request.options.design or design,
                              levels=factor_levels(plan), looks=tuple(adaptive_looks(spec)), held_on=held_on(spec),
                              looks_alpha=spec.adaptive.alpha if spec.adaptive else None, provenance=provenance,
                              settings=tuple(spec.setting_infos()), predictions=_predictions_of(request, spec))
            factors, extra, name = request.factors or factors, {"curves": curves, "signals": load_signals(spec, plan)}, spec.name
            record = yaml.safe_dump(record_data(spec), sort_keys=False, allow_unicode=True, width=120)
        if request.margin is not None:
            options = replace(options, equivalence_margin=metric_units("--equivalence-margin", request.margin, options.metric))
        written = write_staged(request.out, lambda folder: {
            **write_report(table, factors, folder, options=options, **extra), **_write_record(folder, record)})
        if logger is not None:  # the report's own answer (its options) replaces the parent's, as one unit
            try:
                log_answer_to(logger, name, experiment_answer(table, factors, options, options.looks, options.looks_alpha))
            except ExecutorError as err:
                raise ExecutorError(f"the report is written in {request.out}, but not logged to MLflow: {err}") from None
    if logger is not None:
        logger.log_artifacts(str(request.out), "report")
    return ReportOutcome(written, request.out)


def _path_text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _predictions_of(request: ReportRequest, spec: ExperimentSpec) -> str | None:
    """The predictions to confirm: --predictions, else the spec's `confirm:` (None: none)."""
    if request.predictions is not None:
        return str(request.predictions)
    return spec.confirm.predictions if spec.confirm is not None else None


def _write_record(folder: Path, record: str | None) -> dict[str, Path]:
    """The resolved spec the report was made from, as spec.yaml in the report's folder."""
    if record is None:
        return {}
    (folder / "spec.yaml").write_text("# The resolved spec this report was made from (dapo-ablate report).\n" + record,
                                      encoding="utf-8")
    return {"spec.yaml": folder / "spec.yaml"}


def adaptive_looks(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """An adaptive experiment's looks as its ledger recorded them (none for other designs)."""
    if spec.design != "adaptive":
        return []
    ledger = open_ledger(spec)
    if ledger is None:
        return []
    with ledger:
        return adaptive_state(spec, ledger).looks


def experiment_results(experiment: Experiment) -> tuple[pd.DataFrame, list[str], pd.DataFrame | None, str, Any]:
    """`load_experiment_results` of the experiment. When it has no finished runs, the sentence
    ends with the command to run, or, when its folder records a `run` of other runs (other
    overrides), with the commands that report those."""
    try:
        return load_experiment_results(experiment.spec)
    except (ResultsError, LedgerError) as error:
        name = experiment.spec.name
        hint = other_runs_hint(experiment, "report", "--out", "DIR")
        if hint is not None:
            raise UserError(f"experiment {name!r} has no finished runs under this spec; {hint}") from None
        raise UserError(str(error).replace(STORE_RUN_HINT.format(name=name), f"run `{experiment.command('run')}` first")) from None


def refuse_other_runs(experiment: Experiment, finished: int, out: Path) -> None:
    """UserError when the experiment's last `run` had overrides this spec lacks (its runs are not
    this plan's): a report of this spec would use only the {finished} runs it names and replace the
    MLflow parent's answer with theirs; the sentence gives the commands reaching the runs that were run."""
    hint = other_runs_hint(experiment, "report", "--out", str(out))
    if hint is not None:
        raise UserError(f"experiment {experiment.spec.name!r}: this spec names {finished} of its finished runs, but {hint}; "
                        "nothing was written or logged (a report never mixes the runs of two plans)")


def refuse_own_folders(spec: ExperimentSpec, out: Path) -> None:
    """UserError, before any work, for an --out among the experiment's own state: holding its
    output folder or MLflow's artifact folder (`--out .` logged the folder, artifacts and all, as
    the parent's artifacts into itself until the names grew too long: an OSError traceback), or
    inside its runs folder, the evaluation cache or the artifact folder (`--out OUTPUT_DIR/NAME`
    replaced the spec record that `status`, `report` and `run` of the folder read)."""
    target = os.path.realpath(out)
    artifacts = _artifact_folder(spec)
    output_dir = Path(spec.output_dir).expanduser()
    holds = {"the output folder": output_dir, "MLflow's artifact folder": artifacts}
    inside = {"the runs folder": run_root(spec), "the evaluation cache": output_dir / EVAL_CACHE_FOLDER,
              "MLflow's artifact folder": artifacts}
    for what, folder in [*((w, f) for w, f in holds.items() if f and _within(os.path.realpath(f), target)),
                         *((w, f) for w, f in inside.items() if f and _within(target, os.path.realpath(f)))]:
        real = os.path.realpath(folder)
        relation = "is" if target == real else "is inside" if _within(target, real) else "holds"
        raise UserError(f"--out {str(out)!r} {relation} {what} {str(folder)!r} of experiment {spec.name!r}, where it "
                        "keeps its state; choose a folder of the report's own, e.g. --out report")


def _artifact_folder(spec: ExperimentSpec) -> str | None:
    """The local folder MLflow keeps the experiment's artifacts in; None for a server's or none named."""
    tracking = getattr(spec, "tracking", None)
    if tracking is None:
        return None
    location = tracking.artifact_location or default_artifact_location(tracking.uri, spec.output_dir)
    return url2pathname(urlparse(location).path) if location and urlparse(location).scheme == "file" else None


def _within(path: str, folder: str) -> bool:
    """`path` is `folder` or under it (both real paths)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def write_staged(out: Path, write: Any) -> dict[str, Path]:
    """The files `write(folder)` writes, written into a fresh folder beside them and then moved into
    `out` one by one with os.replace: each lands whole, and a symbolic link already in `out` under a
    file's name is replaced itself, never written through. `out` is created only once everything
    was written (a mistake found while writing leaves nothing behind); an `out` that cannot be a
    writable folder (a file, read-only, under /proc) is one sentence before any work."""
    home = _writable_home(out)
    try:
        staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=home))
    except OSError as err:
        raise UserError(f"--out {str(out)!r}: cannot write in {str(home)!r} ({err.strerror or err}); choose another --out") from None
    try:
        written = write(staging)
        out.mkdir(parents=True, exist_ok=True)
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            target = out / path.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        return {name: out / Path(path).relative_to(staging) for name, path in written.items()}
    except OSError as err:
        raise UserError(f"could not write the report into {str(out)!r} ({err.strerror or err}); choose another --out") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _writable_home(out: Path) -> Path:
    """`out` if it is a writable folder, else the nearest folder above it that exists (where the
    staging folder goes, on the same file system); UserError for a file or a folder not writable."""
    if out.is_symlink() and not out.exists():
        raise UserError(f"--out {str(out)!r} is a symbolic link that leads nowhere (a loop or a missing target); "
                        "choose another --out")
    home = out
    while not home.exists() and home != home.parent:
        home = home.parent
    if not home.is_dir():
        raise UserError(f"--out {str(out)!r}: {str(home)!r} is a file, not a folder; choose another --out")
    if not os.access(home, os.W_OK | os.X_OK):
        raise UserError(f"--out {str(out)!r}: {str(home)!r} is not writable; choose another --out")
    return home


def load_signals(spec: ExperimentSpec, plan: Plan) -> pd.DataFrame | None:
    """Per-step training signals of the experiment's finished runs, one row per (run, step): the
    factor columns, ``seed``, ``run_id``, ``step`` and the trainer's signals (the ledger's keys);
    None when no run recorded any, or for a transfer study (the signals figure is per setting-free
    experiment). Read like ``load_experiment_results`` reads its results (only the spec's plan)."""
    ledger = open_ledger(spec)
    if ledger is None or plan.settings:
        return None
    factors = [factor.name for factor in plan.factors]
    with ledger:
        records = planned_records(plan, ledger.results(spec.name), ledger.url)
    rows = [
        {**{name: int(record["factors"][name]) for name in factors}, "seed": record["seed"],
         "run_id": record["run_id"], **point}
        for record in records
        for point in record.get("signals") or []
    ]  # fmt: skip
    return pd.DataFrame(rows) if rows else None


def log_answer_to(logger: Any, experiment_name: str, answer: Answer) -> bool:
    """Put the answer (headline and decision) on the experiment's MLflow parent run as one unit
    (``reports.answer.log_answer``); False when ``logger`` names no tracking URI and parent run."""
    uri, parent_id = getattr(logger, "tracking_uri", None), getattr(logger, "parent_run_id", None)
    if not (uri and parent_id):
        return False
    with store_errors(uri, "check tracking.uri"):  # a store that cannot be opened (a newer schema): one sentence
        tracker = Tracker(uri, None, experiment_name)
        check_parent_id(tracker, experiment_name, parent_id)
        retry_transient(lambda: log_answer(tracker, parent_id, answer), "log the headline to the MLflow parent run",
                        store=MLFLOW)
    return True


def check_parent_id(tracker: Tracker, experiment_name: str, parent_id: str) -> None:
    """ExecutorError, one sentence, unless the parent run id the ledger records is the parent run
    of `experiment_name`'s MLflow experiment (`Tracker.is_parent`): an edited id never has the
    headline or the report written onto another experiment's run."""
    if not tracker.is_parent(parent_id):
        raise ExecutorError(
            f"the ledger names MLflow run {parent_id} as the parent run of {experiment_name!r}, but it is not that "
            f"experiment's parent run in {tracker.uri} (the ledger's row was edited, or the run deleted); run "
            f"`dapo-ablate run` on the spec once to find or make its parent again")


def factor_levels(plan: Plan) -> tuple[FactorInfo, ...]:
    """What each factor's 0 and 1 stand for."""
    return tuple(FactorInfo(f.name, f.low, f.high) for f in plan.factors)


def answer_options(spec: ExperimentSpec, plan: Plan, **fields: Any) -> ReportOptions:
    """The report's options for an experiment: its metric, design, factors' levels and (adaptive)
    looks; `fields` set others (``adjust``, ``confidence``, ...)."""
    return ReportOptions(**{"metric": spec.metric, "design": plan.design, "levels": factor_levels(plan), "held_on": held_on(spec),
                            "looks": tuple(adaptive_looks(spec)),
                            "looks_alpha": spec.adaptive.alpha if spec.adaptive else None, **fields})


def experiment_headline(spec: ExperimentSpec, plan: Plan, records: list[dict[str, Any]], parent_id: str | None,
                        confidence: float = 0.95) -> str:
    """The answer of the plan's finished runs (`records`, as a driver holds them): headline and what
    the data support, as `report` computes them with its default options; logged to the MLflow
    parent run `parent_id` as one unit. The lines back, or one saying why there is none."""
    if not records:
        return f"no headline: experiment {spec.name!r} has no finished runs yet"
    return _answer_lines(spec, plan, lambda: experiment_tables(spec, plan, records, parent_id), confidence, log=True)


def log_experiment_headline(spec_path: str | Path | ExperimentSpec, confidence: float = 0.95) -> str:
    """`experiment_headline` of the experiment ``spec_path`` names (a path, or the spec itself),
    its finished runs read from the ledger."""
    spec = spec_path if isinstance(spec_path, ExperimentSpec) else load_spec(spec_path)
    from dapo_ablate.ablation.store.results import spec_plan

    try:
        plan = spec_plan(spec)
    except (LedgerError, *SPEC_ERRORS) as error:
        return f"no headline: {error}"
    return _answer_lines(spec, plan, lambda: load_experiment_results(spec), confidence, log=True)


def finished_answer(experiment: Experiment) -> str | None:
    """What `status` shows once every planned run is done: the same lines as the end of `run`
    (nothing is logged); None while runs are left, or when the answer cannot be computed."""
    lines = _answer_lines(experiment.spec, experiment.plan, lambda: load_experiment_results(experiment.spec), 0.95, log=False)
    return None if lines.startswith("no headline") else lines


def _answer_lines(spec: ExperimentSpec, plan: Plan, tables: Any, confidence: float, *, log: bool) -> str:
    try:
        table, factors, _, _, logger = tables()
        answer = experiment_answer(table, factors, answer_options(spec, plan, confidence=confidence),
                                   looks=adaptive_looks(spec), looks_alpha=spec.adaptive.alpha if spec.adaptive else None)
        if log and not log_answer_to(logger, spec.name, answer):
            return f"no headline: experiment {spec.name!r} has no MLflow parent run"
    except (ResultsError, ReportInputError, ExecutorError, LedgerError) as error:  # ExecutorError: MLflow stayed down
        return f"no headline: {error}"
    return "\n".join(answer.lines())


__all__ = ["ParentRunLogger", "ReportOutcome", "ReportRequest", "answer_options", "experiment_headline", "finished_answer",
           "load_signals", "log_answer_to", "log_experiment_headline", "report"]
