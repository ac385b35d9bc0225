"""``dapo-ablate report``: parse options, call ``app.report.report`` (imported inside the command,
so that `--help` loads no statistics)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dapo_ablate.ablation.app import texts

from .common import fail, parse_list, user_facing


def parse_orderings(text: str) -> str | list[list[str]]:
    """``paper``, ``all``, or orderings separated by ';' with factors separated by ','."""
    if text in ("paper", "all"):
        return text
    return [parse_list(path) or [] for path in text.split(";") if path.strip()]


@user_facing
def report(
    spec: Optional[Path] = typer.Argument(None, help=texts.SPEC_HELP, show_default=False),
    overrides: Optional[list[str]] = typer.Argument(None, help=texts.SPEC_OVERRIDES_HELP, show_default=False),
    results: Optional[Path] = typer.Option(None, "--results", help="Results CSV instead of a spec."),
    out: Path = typer.Option(..., "--out", help="Directory for the report files."),
    metric: Optional[str] = typer.Option(None, "--metric", help="Metric column to analyse (default: the spec's metric, else avg@32)."),
    orderings: str = typer.Option("paper", "--orderings", help="paper | all | 'a,b,c;c,b,a'."),
    formats: str = typer.Option(",".join(texts.REPORT_FORMATS), "--format", help="Any of md,csv,tex,html,png; add pdf,svg for vector figures (papers)."),
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
        2.0,
        "--equivalence-margin",
        help="Transfer studies: a term 'transfers' only when every pair of settings is shown within this margin "
        f"(two one-sided tests), {texts.UNIT_HELP}; otherwise 'inconclusive'.",
    ),
    predictions: Optional[Path] = typer.Option(
        None, "--predictions",
        help="Another report's predictions.yaml: say term by term whether this experiment confirms, contradicts or "
        "leaves it inconclusive (default: the spec's confirm: section).",
    ),
) -> None:
    """Effects, interactions, order dependence and Shapley values of a factorial, with exact CIs,
    and claims.csv: the claims that pass their family's multiplicity-adjusted test."""
    if results is not None and (overrides or (spec is not None and "=" in spec.name and not spec.exists())):
        fail("KEY=VALUE overrides apply to an experiment spec, not to a --results CSV; drop them")
    if (spec is None) == (results is None):
        fail("give either an experiment spec YAML (or its folder) or --results CSV (exactly one)")
    if adjust not in texts.ADJUSTMENTS:
        fail(f"--adjust {adjust!r} is not one of {', '.join(texts.ADJUSTMENTS)}; holm is the default")
    from dapo_ablate.ablation.app import report as app

    options = app.ReportOptions(orderings=parse_orderings(orderings), formats=parse_list(formats) or [],
                                confidence=confidence, design=design, echo=typer.echo, adjust=adjust,
                                per_effect_tests=per_effect_tests)
    request = app.ReportRequest(out, spec, results, metric, parse_list(factors), options, overrides=overrides,
                                margin=equivalence_margin, predictions=predictions)
    outcome = app.report(request)
    typer.echo(f"wrote {len(outcome.written)} files to {out}")
    claims = outcome.claims_line()
    if claims:
        typer.echo(claims)


def register(cli: typer.Typer) -> None:
    """Add the ``report`` command to the dapo-ablate app."""
    cli.command("report", epilog=texts.SPEC_OVERRIDES_EPILOG)(report)
