"""``dapo-ablate sweep | sweep-report SWEEP.yaml``: Optuna knob sweeps.

Each parses its options and calls one library function; a user's mistake (a bad sweep spec, an
unreachable database or Ray address, an unwritable folder) is one sentence on stderr with exit
status 2, and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dapo_ablate.ablation.app import sweep as app
from dapo_ablate.ablation.app.errors import Interrupted

from .common import user_facing

SWEEP_ARG = typer.Argument(..., help="Sweep spec YAML (see examples/sweep.yaml).")
OVERRIDES_ARG = typer.Argument(
    None, show_default=False,
    help="KEY=VALUE overrides of the sweep spec by its dotted paths, e.g. n_trials=5 trainer.schedule.total_steps=10 "
    "space.eps_high.high=0.5 (values are YAML), validated like the file.",
)
SWEEP_OVERRIDES_EPILOG = (
    "Overrides: KEY=VALUE after the spec sets the sweep spec's field at that dotted path, as if the file said so "
    "(n_trials=40 trainer.schedule.total_steps=10 space.eps_high.high=0.5); values are YAML; an unknown key or a "
    "bad value stops with one sentence (exit 2). Run ids hash each run's non-default trainer config and seed: "
    "runs an override leaves unchanged (n_trials, executor.*, tracking.*) are reused, and the study keeps the "
    "spec's name, so trials run under other overrides stay in it."
)


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
    best = (f"best trial {summary.best_number}: {spec.metric} {summary.best_value:.4f} "
            + " ".join(f"{k}={v}" for k, v in summary.best_params.items())) if summary.best_number is not None else "no complete trial"
    typer.echo(
        f"{spec.name}: {summary.counted}/{summary.n_trials} trials finished ({summary.finished_now} now; "
        f"{states.get('COMPLETE', 0)} complete, {states.get('PRUNED', 0)} pruned, {states.get('FAIL', 0)} failed); "
        f"{best}; {summary.wall_s:.0f} s. Report: dapo-ablate sweep-report {sweep_path} --out DIR"
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
    out: Path = typer.Option(..., "--out", help="Folder for report.md, the CSV tables and the PNG figures."),
) -> None:
    """Write the sweep's best parameters, trials, parameter importances and (robustness mode) factor effects."""
    paths = app.sweep_report(app.load_sweep(sweep_path, overrides), out)
    typer.echo(f"wrote {len(paths)} files to {out}: " + ", ".join(p.name for p in paths))


def register(cli: typer.Typer) -> None:
    """Add sweep and sweep-report to the dapo-ablate app."""
    cli.command("sweep", epilog=SWEEP_OVERRIDES_EPILOG)(sweep)
    cli.command("sweep-report", epilog=SWEEP_OVERRIDES_EPILOG)(sweep_report)
