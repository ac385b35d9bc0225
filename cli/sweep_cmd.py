"""``dapo-ablate sweep | sweep-report SWEEP.yaml``: Optuna knob sweeps.

Each parses its options and calls one library function; a user's mistake (a bad sweep spec, an
unreachable database or Ray address, an unwritable folder) is one sentence on stderr with exit
status 2, and nothing is written. The app layer (Optuna, Ray) is imported inside each command,
so that `--help` loads none of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dapo_ablate.ablation.app import texts
from dapo_ablate.ablation.app.errors import Interrupted

from .common import user_facing

SWEEP_ARG = typer.Argument(..., help=texts.SWEEP_HELP, show_default=False)
OVERRIDES_ARG = typer.Argument(None, help=texts.SWEEP_OVERRIDES_HELP, show_default=False)


@user_facing
def sweep(
    sweep_path: Path = SWEEP_ARG,
    overrides: Optional[list[str]] = OVERRIDES_ARG,
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (overrides executor.address)."),
    n_trials: Optional[int] = typer.Option(None, "--n-trials", min=1, help="Finished trials wanted in all (overrides n_trials)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the spec, folders and Ray address, print the plan, stop."),
) -> None:
    """Run (or resume) the sweep's Optuna study: trials on Ray, runs in the ledger, trials in MLflow."""
    from dapo_ablate.ablation.app import sweep as app

    spec = app.load_sweep(sweep_path, overrides)
    if dry_run:
        typer.echo(app.sweep_plan(spec, address, n_trials))
        return
    try:
        summary = app.sweep(spec, address=address, n_trials=n_trials, progress=progress)
    except Interrupted as stopped:  # Ctrl-C or SIGTERM during the checks or Ray's start
        typer.echo(f"{spec.name}: {stopped}", err=True)
        raise typer.Exit(stopped.exit_code) from None
    states = summary.states
    best = app.best_trial_text(spec, summary)
    typer.echo(
        f"{spec.name}: {summary.counted}/{summary.n_trials} trials finished ({summary.finished_now} now; "
        f"{states.get('COMPLETE', 0)} complete, {states.get('PRUNED', 0)} pruned, {states.get('FAIL', 0)} failed); "
        f"{best}; {summary.wall_s:.0f} s. Report: {app.report_hint(spec)}"
    )
    for number, error in summary.failures.items():
        typer.echo(f"  trial {number} failed: {error}", err=True)
    if summary.interrupted:
        typer.echo("interrupted: running trials were queued again; run the command again to resume", err=True)
    raise typer.Exit(summary.exit_code)


@user_facing
def sweep_report(
    sweep_path: Path = SWEEP_ARG,
    overrides: Optional[list[str]] = OVERRIDES_ARG,
    out: Path = typer.Option(..., "--out", help="Folder for report.md, sweep_report.html, the CSV tables and the PNG figures."),
) -> None:
    """Write the sweep's best parameters, trials, parameter importances and (robustness mode) factor effects:
    CSVs (fractions) and report.md, sweep_report.html and PNG figures (percentage points)."""
    from dapo_ablate.ablation.app import sweep as app

    run_command = texts.command_line("sweep", sweep_path, overrides or ())
    paths = app.sweep_report(app.load_sweep(sweep_path, overrides), out, run_command)
    typer.echo(f"wrote {len(paths)} files to {out}: " + ", ".join(p.name for p in paths))


def register(cli: typer.Typer) -> None:
    """Add sweep and sweep-report to the dapo-ablate app."""
    cli.command("sweep", epilog=texts.SWEEP_OVERRIDES_EPILOG)(sweep)
    cli.command("sweep-report", epilog=texts.SWEEP_OVERRIDES_EPILOG)(sweep_report)
