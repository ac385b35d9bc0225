"""``dapo-ablate plan-seeds``: seeds per cell for 80% power, per claims family, before booking GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dapo_ablate.cli.report_cmd import parse_list
from dapo_ablate.cli.train_cmd import fail
from dapo_ablate.reports import ReportInputError, load_results_csv
from dapo_ablate.reports.multiplicity import ADJUSTMENTS
from dapo_ablate.reports.power import pilot_sigma, plan_seeds as plan


def _from_spec(spec: Path, metric: str | None, sd: float | None):
    """(factors, metric, pilot results or None) of an experiment spec; its results if it ran."""
    from dapo_ablate.ablation.store.ledger import LedgerError
    from dapo_ablate.ablation.store.results import ResultsError, load_experiment_results
    from dapo_ablate.ablation.experiment.spec import SpecError, load_spec
    from dapo_ablate.core.config import ConfigError

    try:
        loaded = load_spec(spec)
    except (SpecError, ConfigError) as error:
        fail(str(error))
    metric = metric or loaded.metric
    try:
        results, factors, *_ = load_experiment_results(spec)
        return factors, metric, results
    except (ResultsError, LedgerError) as error:
        if sd is None:
            fail(f"{error}; without pilot results, pass --sd (the run-to-run sd of {metric})")
        from dapo_ablate.ablation.experiment.design import expand

        return [factor.name for factor in expand(loaded).factors], metric, None


def plan_seeds(
    spec: Optional[Path] = typer.Argument(None, help="Experiment spec YAML (its results, if any, are the pilot)."),
    results: Optional[Path] = typer.Option(None, "--results", help="Pilot results CSV instead of a spec."),
    effect: float = typer.Option(..., "--effect", help="Size to detect, in metric units (0.02 = 2 pp of avg@32)."),
    sd: Optional[float] = typer.Option(None, "--sd", help="Run-to-run sd of the metric, instead of a pilot's."),
    metric: Optional[str] = typer.Option(None, "--metric", help="Metric column (default: the spec's, else avg@32)."),
    factors: Optional[str] = typer.Option(None, "--factors", help="Factor columns of a pilot CSV, e.g. a,b."),
    power: float = typer.Option(0.8, "--power", help="Power wanted for each family."),
    confidence: float = typer.Option(0.95, "--confidence", help="The report's confidence level (alpha = 1 - it)."),
    adjust: str = typer.Option("holm", "--adjust", help="The report's adjustment: holm | bh | none."),
) -> None:
    """Seeds per cell needed to claim an effect of a given size with the wanted power, in each
    claims family, for the full design and the half fraction."""
    if spec is not None and results is not None:
        fail("give an experiment spec YAML or --results CSV, not both")
    if spec is None and results is None and sd is None:
        fail("give an experiment spec YAML, a pilot --results CSV, or --sd with --factors")
    for name, value, low, high in (("--effect", effect, 0, None), ("--power", power, 0, 1), ("--confidence", confidence, 0, 1)):
        if not (value > low and (high is None or value < high)) or value != value:
            fail(f"{name} {value} is out of range; use a number above {low}" + (f" and below {high}" if high else ""))
    if sd is not None and not (sd > 0 and sd < float("inf")):
        fail(f"--sd {sd} is not a positive number; give the run-to-run sd of the metric")
    if adjust not in ADJUSTMENTS:
        fail(f"--adjust {adjust!r} is not one of {', '.join(ADJUSTMENTS)}; holm is the default")
    try:
        metric = metric or "avg@32"
        pilot, names = None, parse_list(factors)
        if results is not None:
            pilot, names = load_results_csv(results, names, metric)
        elif spec is not None:
            names, metric, pilot = _from_spec(spec, metric if metric != "avg@32" else None, sd)
        if not names:
            fail("no factors: pass --factors a,b,... with --sd")
        if sd is None:
            sd, source = pilot_sigma(pilot, names, metric)
        else:
            source = "--sd"
        table = plan(names, sd, effect, power, 1 - confidence, adjust)
    except ReportInputError as error:
        fail(str(error))
    typer.echo(
        f"Seeds per cell to claim a statistic of size {effect:g} ({metric}) with {power:.0%} power at the report's "
        f"{adjust} adjustment (alpha {1 - confidence:.2g}); run noise sd {sd:.4g} from {source}:"
    )
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    typer.echo(
        "The size is the statistic itself: a Shapley value, an interaction effect (mean of the +1 cells minus the "
        "-1 cells), a gain added last minus added first. A pilot's sd is itself an estimate: plan with margin."
    )


def register(app: typer.Typer) -> None:
    """Add the ``plan-seeds`` command to the dapo-ablate app."""
    app.command("plan-seeds")(plan_seeds)
