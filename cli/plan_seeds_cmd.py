"""``dapo-ablate plan-seeds``: seeds per cell for 80% power, per claims family, before booking GPUs;
for a transfer study (two or more settings), per verdict from each setting's own noise
(the statistics are imported inside the command, so that `--help` loads none of them)."""

from __future__ import annotations

import math
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
    effect: float = typer.Option(
        ..., "--effect", help=f"Size to detect (a transfer study: the difference between settings), {texts.UNIT_HELP}."
    ),
    sd: Optional[str] = typer.Option(
        None, "--sd", help=f"Run-to-run sd of the metric, instead of a pilot's, {texts.UNIT_HELP}; a transfer study: one "
        "for every setting, or one per setting (1.1,2.1,1.9)."
    ),
    metric: Optional[str] = typer.Option(None, "--metric", help="Metric column (default: the spec's, else avg@32)."),
    factors: Optional[str] = typer.Option(None, "--factors", help="Factor columns of a pilot CSV, e.g. a,b."),
    power: float = typer.Option(0.8, "--power", help="Power wanted for each family (a transfer study: each verdict)."),
    confidence: float = typer.Option(0.95, "--confidence", help="The report's confidence level (alpha = 1 - it)."),
    adjust: str = typer.Option("holm", "--adjust", help="The report's adjustment: holm | bh | none."),
    settings: Optional[str] = typer.Option(
        None, "--settings", help="A transfer study planned from --sd: its settings, e.g. base,tight (a spec or pilot "
        "names its own)."
    ),
    equivalence_margin: Optional[float] = typer.Option(
        None, "--equivalence-margin", help=f"A transfer study: the report's margin for 'transfers', {texts.UNIT_HELP} "
        "(default 2, the report's)."
    ),
    seeds: Optional[str] = typer.Option(
        None, "--seeds", help="A transfer study: seeds per cell you can run (one for every setting, or one per "
        "setting); says what they buy: the smallest margin and difference reached with the power wanted."
    ),
) -> None:
    """Seeds per cell needed to claim an effect of a given size with the wanted power, in each
    claims family, for the full design and the half fraction; with two or more settings, for the
    transfer report's "transfers" and "differs" verdicts."""
    _check(spec, results, sd, overrides, settings, equivalence_margin)
    for name, value, low, high in (("--effect", effect, 0, None), ("--power", power, 0, 1), ("--confidence", confidence, 0, 1)):
        if not (value > low and (high is None or value < high)) or value != value:
            fail(f"{name} {value} is out of range; use a number above {low}" + (f" and below {high}" if high else ""))
    if adjust not in texts.ADJUSTMENTS:
        fail(f"--adjust {adjust!r} is not one of {', '.join(texts.ADJUSTMENTS)}; holm is the default")
    from dapo_ablate.ablation.app import seeds as app

    request = app.SeedsRequest(
        effect, spec, results, _sds(sd), metric, parse_list(factors), power, confidence, adjust, overrides,
        settings=parse_list(settings), margin=equivalence_margin, seeds=_counts(seeds),
    )  # fmt: skip
    found = app.plan_seeds(request)
    if isinstance(found, app.TransferSeedPlan):
        _echo_transfer(found, power, confidence, adjust)
    else:
        _echo_families(found, effect, power, confidence, adjust)


def _check(spec, results, sd, overrides, settings, margin) -> None:
    """One sentence for inputs that cannot go together, before anything is read."""
    if spec is not None and results is not None:
        fail("give an experiment spec YAML or --results CSV, not both")
    if spec is None and results is None and sd is None:
        fail("give an experiment spec YAML, a pilot --results CSV, or --sd with --factors")
    if overrides and spec is None:
        fail("KEY=VALUE overrides apply to an experiment spec; give the spec YAML before them")
    if settings is not None and len(parse_list(settings)) < 2:
        fail(f"--settings {settings!r} names fewer than two settings; a transfer study compares two or more, e.g. base,tight")
    if margin is not None and not (margin > 0 and math.isfinite(margin)):
        fail(f"--equivalence-margin {margin} is not a positive number; give the margin in pp, e.g. 2")


def _echo_families(found, effect: float, power: float, confidence: float, adjust: str) -> None:
    """One setting's plan: seeds per cell per claims family."""
    from dapo_ablate.ablation.app import seeds as app

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


def _sds(text: Optional[str]) -> Optional[list[float]]:
    """--sd: one positive number or a comma-separated list of them."""
    if text is None:
        return None
    values = []
    for item in parse_list(text) or [text]:
        try:
            value = float(item)
        except ValueError:
            value = float("nan")
        if not (value > 0 and math.isfinite(value)):
            fail(f"--sd {item} is not a positive number; give the run-to-run sd of the metric (one, or one per setting: 1.1,2.1)")
        values.append(value)
    return values


def _counts(text: Optional[str]) -> Optional[list[int]]:
    """--seeds: one whole number or a comma-separated list of them."""
    if text is None:
        return None
    counts = []
    for item in parse_list(text) or [text]:
        if not item.isdigit():
            fail(f"--seeds {item} is not a whole number of seeds per cell; give one count, or one per setting: 3,3,9")
        counts.append(int(item))
    return counts


def _echo_transfer(plan, power: float, confidence: float, adjust: str) -> None:
    """A transfer study's plan as plan-seeds prints it (``app.seeds.transfer_display``)."""
    from dapo_ablate.ablation.app import seeds as app

    pp = app.is_accuracy(plan.metric)
    amount = (lambda v: f"{100 * v:.3g} pp") if pp else (lambda v: f"{v:.4g}")  # noqa: E731
    table, budget = app.transfer_display(plan)
    names = [setting.name for setting in plan.settings]
    typer.echo(
        f"Transfer study of {len(names)} settings ({plan.metric}): seeds per cell for {power:.0%} power of the "
        f"transfer report's verdict at its {adjust} adjustment (alpha {1 - confidence:.2g}), from each setting's own "
        "run noise sd:"
    )
    for setting in plan.settings:
        typer.echo(f"  {setting.name}: {amount(setting.sd)} from {setting.source}")
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    typer.echo(
        f"transfers: the same effect in every setting, shown within --equivalence-margin {amount(plan.margin)} by two "
        f"one-sided tests for every pair of settings. differs: the effect {amount(plan.effect)} apart in the two least "
        "precise settings, the others between them (the hardest case), claimed as 'differs in size' or 'flips sign'."
    )
    by_noise = (
        f"; by_noise: seeds per setting ({' / '.join(names)}) in proportion to its sd, the fewest runs, which one spec "
        "cannot run (its seeds are every setting's)"
    )
    typer.echo(
        "seeds_per_cell: the same in every setting, as one spec runs them" + (by_noise if "by_noise" in table.columns else "")
        + ". Each power: 10,000 simulated reports with the report's own tests. A pilot's sd is itself an estimate: "
        "plan with margin."
    )
    if budget is not None:
        typer.echo(f"What {' / '.join(map(str, plan.seeds))} seeds per cell ({' / '.join(names)}) buy at {power:.0%} power:")
        typer.echo(budget.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        typer.echo(
            "transfers_margin: the smallest --equivalence-margin within which equal effects are shown ('transfers'); "
            "detectable_difference: the smallest difference between two settings the report claims ('differs')."
        )


def register(cli: typer.Typer) -> None:
    """Add the ``plan-seeds`` command to the dapo-ablate app."""
    cli.command("plan-seeds", epilog=texts.SPEC_OVERRIDES_EPILOG)(plan_seeds)
