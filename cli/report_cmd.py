"""``dapo-ablate report``: parse options, load results, call ``reports.write_report``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dapo_ablate.cli.train_cmd import fail
from dapo_ablate.reports import FORMATS, ReportInputError, load_results_csv, write_report
from dapo_ablate.reports.multiplicity import ADJUSTMENTS


def parse_list(text: str | None) -> list[str] | None:
    """``"a, b"`` -> ["a", "b"]; None stays None."""
    if text is None:
        return None
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_orderings(text: str) -> str | list[list[str]]:
    """``paper``, ``all``, or orderings separated by ';' with factors separated by ','."""
    if text in ("paper", "all"):
        return text
    return [parse_list(path) or [] for path in text.split(";") if path.strip()]


def _load_experiment(spec: Path):
    """``(results, factors, curves, design, mlflow_logger, spec)`` of an experiment from its spec
    file; a bad spec or an experiment without results is a user's mistake (one sentence, exit 2)."""
    from dapo_ablate.ablation.store.ledger import LedgerError
    from dapo_ablate.ablation.store.results import ResultsError, load_experiment_results
    from dapo_ablate.ablation.experiment.spec import SpecError, load_spec
    from dapo_ablate.core.config import ConfigError

    try:
        return (*load_experiment_results(spec), load_spec(spec))
    except (SpecError, ConfigError, ResultsError, LedgerError) as error:
        fail(str(error))


def load_signals(spec_path: Path):
    """Per-step training signals of the experiment's finished runs, one row per (run, step): the
    factor columns, ``seed``, ``run_id``, ``step`` and the trainer's signals (the ledger's keys);
    None when no run recorded any, or for a transfer study (the signals figure is per setting-free
    experiment). Read like ``load_experiment_results`` reads its results (only the spec's plan).
    """
    import pandas as pd

    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.store.results import open_ledger
    from dapo_ablate.ablation.experiment.spec import load_spec

    spec = load_spec(spec_path)
    ledger = open_ledger(spec)
    plan = expand(spec) if ledger is not None else None
    if plan is None or plan.settings:
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


def _log_to_mlflow(logger, out: Path) -> None:
    """Attach the report to the experiment's MLflow parent run.

    ``logger`` comes from ``load_experiment_results``: either a callable ``log(local_dir)`` or an
    object with ``log_artifacts(local_dir, artifact_path)`` bound to the parent run.
    """
    if callable(logger):
        logger(str(out))
    else:
        logger.log_artifacts(str(out), "report")


def log_headline(logger, experiment_name: str, results, factors: list[str], metric: str, confidence: float) -> dict:
    """Put the headline (full vs baseline with CI, best cell) on the experiment's MLflow parent run
    (``reports.headline.log_parent_headline``) and return it by setting. ``logger``: the
    ``ParentRunLogger`` of ``load_experiment_results``; one that names no tracking URI and parent
    run logs nothing (returns {})."""
    uri, parent_id = getattr(logger, "tracking_uri", None), getattr(logger, "parent_run_id", None)
    if not (uri and parent_id):
        return {}
    from dapo_ablate.ablation.store.tracking import Tracker
    from dapo_ablate.reports.headline import log_parent_headline

    return log_parent_headline(Tracker(uri, None, experiment_name), parent_id, results, factors, metric, confidence)


def log_experiment_headline(spec_path, confidence: float = 0.95) -> str:
    """Read the finished runs of the experiment ``spec_path`` names (a path, or the spec itself),
    log their headline to its MLflow parent run and return the headline sentence; when there is
    nothing to read or analyse yet, log nothing and return one sentence saying why. For the end
    of ``dapo-ablate run``."""
    from dapo_ablate.ablation.store.results import ResultsError, load_experiment_results
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec, load_spec
    from dapo_ablate.reports.headline import headline_lines

    spec = spec_path if isinstance(spec_path, ExperimentSpec) else load_spec(spec_path)
    try:
        table, factor_names, _, _, logger = load_experiment_results(spec)
        found = log_headline(logger, spec.name, table, factor_names, spec.metric, confidence)
        if not found:
            return f"no headline: experiment {spec.name!r} has no MLflow parent run"
    except (ResultsError, ReportInputError) as error:
        return f"no headline: {error}"
    return " ".join(f"{name + ': ' if name else ''}{headline_lines(h)[0]}" for name, h in found.items())


def report(
    spec: Optional[Path] = typer.Argument(None, help="Experiment spec YAML whose results to report."),
    results: Optional[Path] = typer.Option(None, "--results", help="Results CSV instead of a spec."),
    out: Path = typer.Option(..., "--out", help="Directory for the report files."),
    metric: Optional[str] = typer.Option(None, "--metric", help="Metric column to analyse (default: the spec's metric, else avg@32)."),
    orderings: str = typer.Option("paper", "--orderings", help="paper | all | 'a,b,c;c,b,a'."),
    formats: str = typer.Option(",".join(FORMATS), "--format", help="Any of md,csv,tex,html,png."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence level of the intervals."),
    factors: Optional[str] = typer.Option(
        None, "--factors", help="Factor columns, e.g. a,b (default: the 0/1 columns or the spec's)."
    ),
    seed: int = typer.Option(0, "--seed", hidden=True, help="No effect: intervals are exact (kept for old scripts)."),
    design: Optional[str] = typer.Option(
        None,
        "--design",
        help="Weakest design to accept: any | full | fraction-V (refuses fractions below resolution V) | fraction; "
        "default: the spec's design, else any.",
    ),
    adjust: str = typer.Option(
        "holm", "--adjust", help="Multiplicity adjustment within each claims family: holm | bh | none."
    ),
    per_effect_tests: bool = typer.Option(
        False,
        "--per-effect-tests",
        help="With one seed per cell, test effects one by one (Lenth's ME) instead of the experiment-wise SME.",
    ),
    equivalence_margin: float = typer.Option(
        0.02,
        "--equivalence-margin",
        help="Transfer studies: a term 'transfers' only when every pair of settings is shown within this margin "
        "(two one-sided tests), in the metric's units (0.02 = 2 pp of an accuracy); otherwise 'inconclusive'.",
    ),
) -> None:
    """Effects, interactions, order dependence and Shapley values of a factorial, with exact CIs,
    and claims.csv: the claims that pass their family's multiplicity-adjusted test."""
    if (spec is None) == (results is None):
        typer.echo("error: give either an experiment spec YAML or --results CSV (exactly one)", err=True)
        raise typer.Exit(2)
    if adjust not in ADJUSTMENTS:
        fail(f"--adjust {adjust!r} is not one of {', '.join(ADJUSTMENTS)}; holm is the default")
    logger, curves, signals = None, None, None
    try:
        if results is not None:
            metric = metric or "avg@32"
            table, factor_names = load_results_csv(results, parse_list(factors), metric)
        else:
            table, factor_names, curves, spec_design, logger, experiment = _load_experiment(spec)
            signals = load_signals(spec)
            metric = metric or experiment.metric
            factor_names = parse_list(factors) or factor_names
            design = design or spec_design
        written = write_report(
            table,
            factor_names,
            out,
            metric=metric,
            orderings=parse_orderings(orderings),
            formats=parse_list(formats) or [],
            confidence=confidence,
            curves=curves,
            design=design,
            echo=typer.echo,
            adjust=adjust,
            per_effect_tests=per_effect_tests,
            signals=signals,
            equivalence_margin=equivalence_margin,
        )
        if logger is not None:
            log_headline(logger, experiment.name, table, factor_names, metric, confidence)
    except ReportInputError as error:
        fail(str(error))
    if logger is not None:
        _log_to_mlflow(logger, out)
    typer.echo(f"wrote {len(written)} files to {out}")


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the dapo-ablate app."""
    app.command("report")(report)
