"""``dapo-ablate plan-seeds``: seeds per cell for 80% power, per claims family, before booking GPUs
(the statistics are imported inside the command, so that `--help` loads none of them)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dapo_ablate.ablation.app import texts

from .common import fail, parse_list, user_facing


@user_facing
def plan_seeds(
    spec: Optional[Path] = typer.Argument(
        None, show_default=False, help=texts.SPEC_HELP + " Its finished runs, if any, are the pilot."
    ),
    overrides: Optional[list[str]] = typer.Argument(None, help=texts.SPEC_OVERRIDES_HELP, show_default=False),
    results: Optional[Path] = typer.Option(None, "--results", help="Pilot results CSV instead of a spec."),
    effect: float = typer.Option(..., "--effect", help=f"Size to detect, {texts.UNIT_HELP}."),
    sd: Optional[float] = typer.Option(None, "--sd", help=f"Run-to-run sd of the metric, instead of a pilot's; {texts.UNIT_HELP}."),
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
    if adjust not in texts.ADJUSTMENTS:
        fail(f"--adjust {adjust!r} is not one of {', '.join(texts.ADJUSTMENTS)}; holm is the default")
    if overrides and spec is None:
        fail("KEY=VALUE overrides apply to an experiment spec; give the spec YAML before them")
    from dapo_ablate.ablation.app import seeds as app

    request = app.SeedsRequest(effect, spec, results, sd, metric, parse_list(factors), power, confidence, adjust,
                               overrides)
    found = app.plan_seeds(request)
    metric, sd, source, table = found.metric, found.sd, found.source, found.table
    pp = app.is_accuracy(metric)
    size, noise = (f"{effect:g} pp", f"{100 * sd:.3g} pp") if pp else (f"{effect:g}", f"{sd:.4g}")
    typer.echo(
        f"Seeds per cell to claim a statistic of size {size} ({metric}) with {power:.0%} power at the report's "
        f"{adjust} adjustment (alpha {1 - confidence:.2g}); run noise sd {noise} from {source}:"
    )
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    typer.echo(
        "The size is the statistic itself: a Shapley value, an interaction effect (mean of the +1 cells minus the "
        "-1 cells), a gain added last minus added first. A pilot's sd is itself an estimate: plan with margin."
    )


def register(cli: typer.Typer) -> None:
    """Add the ``plan-seeds`` command to the dapo-ablate app."""
    cli.command("plan-seeds", epilog=texts.SPEC_OVERRIDES_EPILOG)(plan_seeds)
