"""``report``: the causal-isolation report of an experiment (from its ledger) or of a results CSV,
attached to the experiment's MLflow parent run with its headline; and the headline alone, as
`run` puts it on the parent run when every run is done."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from dapo_ablate.ablation.app.errors import user_errors
from dapo_ablate.ablation.experiment.design import Plan, expand
from dapo_ablate.ablation.experiment.spec import ExperimentSpec, SpecError, load_spec
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.results import (
    ParentRunLogger,
    ResultsError,
    experiment_tables,
    load_experiment_results,
    open_ledger,
)
from dapo_ablate.ablation.store.tracking import Tracker
from dapo_ablate.core.config import ConfigError
from dapo_ablate.core.contracts import DEFAULT_METRIC
from dapo_ablate.reports import FORMATS, ReportInputError, ReportOptions, load_results_csv, write_report  # noqa: F401 - FORMATS: the CLI's default
from dapo_ablate.reports.headline import headline_lines, log_parent_headline
from dapo_ablate.reports.multiplicity import ADJUSTMENTS  # noqa: F401 - the CLI checks --adjust against it

ERRORS = (ReportInputError, SpecError, ConfigError, ResultsError, LedgerError)


@dataclass(frozen=True)
class ReportRequest:
    """One report: of the experiment spec `spec` (its ledger's finished runs), or of the results
    CSV `results`; written into `out`. `metric` None: the spec's, else avg@32; `factors` None: the
    spec's, else the CSV's 0/1 columns; `options.design` None: the spec's design."""

    out: Path
    spec: Path | None = None
    results: Path | None = None
    metric: str | None = None
    factors: list[str] | None = None
    options: ReportOptions = field(default_factory=ReportOptions)


@dataclass(frozen=True)
class ReportOutcome:
    written: dict[str, Path]
    out: Path


def report(request: ReportRequest) -> ReportOutcome:
    """Write the report's files; with a spec, attach them and the headline to the experiment's
    MLflow parent run."""
    with user_errors(*ERRORS):
        if request.results is not None:
            metric = request.metric or DEFAULT_METRIC
            table, factors = load_results_csv(request.results, request.factors, metric)
            options, logger, extra, name = replace(request.options, metric=metric), None, {}, ""
        else:
            spec = load_spec(request.spec)
            plan = expand(spec)
            table, factors, curves, design, logger = load_experiment_results(spec)
            options = replace(request.options, metric=request.metric or spec.metric, design=request.options.design or design)
            factors, extra, name = request.factors or factors, {"curves": curves, "signals": load_signals(spec, plan)}, spec.name
        written = write_report(table, factors, request.out, options=options, **extra)
        if logger is not None:
            log_headline(logger, name, table, factors, options.metric, options.confidence)
    if logger is not None:
        logger.log_artifacts(str(request.out), "report")
    return ReportOutcome(written, request.out)


def load_signals(spec: ExperimentSpec, plan: Plan) -> pd.DataFrame | None:
    """Per-step training signals of the experiment's finished runs, one row per (run, step): the
    factor columns, ``seed``, ``run_id``, ``step`` and the trainer's signals (the ledger's keys);
    None when no run recorded any, or for a transfer study (the signals figure is per setting-free
    experiment). Read like ``load_experiment_results`` reads its results (only the spec's plan)."""
    ledger = open_ledger(spec)
    if ledger is None or plan.settings:
        return None
    planned, factors = {run.run_id for run in plan.runs}, [factor.name for factor in plan.factors]
    with ledger:
        records = [record for record in ledger.results(spec.name) if record["run_id"] in planned]
    rows = [
        {**{name: int(record["factors"][name]) for name in factors}, "seed": record["seed"],
         "run_id": record["run_id"], **point}
        for record in records
        for point in record.get("signals") or []
    ]  # fmt: skip
    return pd.DataFrame(rows) if rows else None


def log_headline(logger: Any, experiment_name: str, results: pd.DataFrame, factors: list[str], metric: str,
                 confidence: float) -> dict:
    """Put the headline (full vs baseline with CI, best cell) on the experiment's MLflow parent run
    (``reports.headline.log_parent_headline``) and return it by setting. ``logger``: a
    `ParentRunLogger`; one that names no tracking URI and parent run logs nothing (returns {})."""
    uri, parent_id = getattr(logger, "tracking_uri", None), getattr(logger, "parent_run_id", None)
    if not (uri and parent_id):
        return {}
    return log_parent_headline(Tracker(uri, None, experiment_name), parent_id, results, factors, metric, confidence)


def experiment_headline(spec: ExperimentSpec, plan: Plan, records: list[dict[str, Any]], parent_id: str | None,
                        confidence: float = 0.95) -> str:
    """The headline of the plan's finished runs (`records`, as a driver holds them), logged to the
    MLflow parent run `parent_id`; the sentence back, or one saying why there is none."""
    if not records:
        return f"no headline: experiment {spec.name!r} has no finished runs yet"
    return _headline(spec, lambda: experiment_tables(spec, plan, records, parent_id), confidence)


def log_experiment_headline(spec_path: str | Path | ExperimentSpec, confidence: float = 0.95) -> str:
    """`experiment_headline` of the experiment ``spec_path`` names (a path, or the spec itself),
    its finished runs read from the ledger."""
    spec = spec_path if isinstance(spec_path, ExperimentSpec) else load_spec(spec_path)
    return _headline(spec, lambda: load_experiment_results(spec), confidence)


def _headline(spec: ExperimentSpec, tables: Any, confidence: float) -> str:
    try:
        table, factors, _, _, logger = tables()
        found = log_headline(logger, spec.name, table, factors, spec.metric, confidence)
        if not found:
            return f"no headline: experiment {spec.name!r} has no MLflow parent run"
    except (ResultsError, ReportInputError) as error:
        return f"no headline: {error}"
    return " ".join(f"{name + ': ' if name else ''}{headline_lines(h)[0]}" for name, h in found.items())


__all__ = ["ParentRunLogger", "ReportOutcome", "ReportRequest", "experiment_headline", "load_signals", "log_experiment_headline",
           "log_headline", "report"]
