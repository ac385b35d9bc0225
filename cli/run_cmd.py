"""``dapo-ablate run | validate | status | ui SPEC.yaml``: the factorial scheduler's commands.

Each parses its options and calls one library function; a user's mistake (a bad spec, an
unreachable database or Ray address, an unwritable folder) is one sentence on stderr with exit
status 2, and nothing is written.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Optional

import typer

from dapo_ablate.ablation.runtime.preflight import preflight
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.results import ResultsError
from dapo_ablate.ablation.experiment.spec import SpecError
from dapo_ablate.core.config import ConfigError

from dapo_ablate.ablation.experiment.overrides import SPEC_OVERRIDES_EPILOG, SPEC_OVERRIDES_HELP, OverrideError, load_spec_with_overrides
from .train_cmd import fail

USER_ERRORS = (SpecError, ConfigError, LedgerError, ExecutorError, ResultsError)
SPEC_ARG = typer.Argument(..., help="Experiment spec YAML (see examples/factorial.yaml).")
OVERRIDES_ARG = typer.Argument(None, help=SPEC_OVERRIDES_HELP, show_default=False)


def _plan(spec_path: Path, overrides: list[str] | None = None):
    """(spec, plan) of a spec file with its command-line overrides, a mistake in either ending the
    command with exit status 2."""
    from dapo_ablate.ablation.experiment.design import DesignError, expand
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

    try:
        spec = load_spec_with_overrides(ExperimentSpec, spec_path, overrides, kind="spec")
        return spec, expand(spec)
    except (*USER_ERRORS, DesignError, OverrideError) as err:
        fail(str(err))


def run(
    spec_path: Path = SPEC_ARG,
    overrides: Optional[list[str]] = OVERRIDES_ARG,
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (overrides executor.address)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and stop (same as validate)."),
    max_concurrent: Optional[int] = typer.Option(None, "--max-concurrent", min=1, help="Most runs at a time."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Give runs that used up executor.retries + 1 attempts a fresh budget."
    ),
) -> None:
    """Run every cell x seed of the spec that is not done yet, on Ray; log to the ledger and MLflow."""
    spec, plan = _plan(spec_path, overrides)
    if dry_run:
        _validate(spec, plan, address)
        return
    from dapo_ablate.ablation.runtime.executor import run_experiment
    from dapo_ablate.ablation.runtime.signals import Interrupted

    _verl_checked(spec, plan)
    try:
        summary = run_experiment(
            spec, plan, address=address, progress=progress, max_concurrent=max_concurrent, retry_failed=retry_failed
        )
    except USER_ERRORS as err:
        fail(str(err))
    except Interrupted as stopped:  # Ctrl-C or SIGTERM during the checks or Ray's start
        typer.echo(f"{spec.name}: {stopped}", err=True)
        raise typer.Exit(stopped.exit_code) from None
    counts = summary.counts
    typer.echo(
        f"{spec.name}: {counts['done']}/{sum(counts.values())} runs done ({summary.finished} now, "
        f"{summary.already_done} before), {counts['failed']} failed, {counts['pending'] + counts['running']} "
        f"not finished; {summary.wall_s:.0f} s. Browse: dapo-ablate ui {spec_path}"
    )
    for name, error in summary.failures.items():
        typer.echo(f"  failed {name}: {error}", err=True)
    if summary.interrupted:
        typer.echo("interrupted: runs in flight were put back to pending; run the command again to resume", err=True)
    elif summary.exit_code == 0:  # every run done: the headline goes on the MLflow parent (as `report` puts it)
        from dapo_ablate.cli.report_cmd import log_experiment_headline

        typer.echo(log_experiment_headline(spec))
    raise typer.Exit(summary.exit_code)


def validate(
    spec_path: Path = SPEC_ARG,
    overrides: Optional[list[str]] = OVERRIDES_ARG,
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address to check."),
) -> None:
    """Check the spec, its folders and Ray address, and print the plan (writes nothing)."""
    spec, plan = _plan(spec_path, overrides)
    _validate(spec, plan, address)


def _validate(spec, plan, address: str | None) -> None:
    from dapo_ablate.ablation.experiment.plan import format_plan

    try:
        preflight(spec, address if address is not None else spec.executor.address)
    except USER_ERRORS as err:
        fail(str(err))
    typer.echo(format_plan(plan))
    typer.echo(_ledger_line(spec, plan))
    if _verl_checked(spec, plan):  # backend verl: every cell's verl command and a GPU-hour estimate
        from dapo_ablate.ablation.runtime.backends.verl_plan import format_verl_jobs

        typer.echo(format_verl_jobs(spec, plan))


def _ledger_line(spec, plan) -> str:
    """Where the plan's runs stand in the ledger (read only: a missing ledger is not created)."""
    from dapo_ablate.ablation.store.results import status_rows

    try:
        _, counts = status_rows(spec, plan)
    except USER_ERRORS as err:
        return f"ledger   not readable ({err}); all {len(plan.runs)} runs counted as to do"
    done, total = counts.get("done", 0), len(plan.runs)
    to_do = total - done
    parts = ", ".join(f"{counts[key]} {key}" for key in ("done", "running", "failed", "pending", "new") if counts.get(key))
    return f"ledger   {parts}: {to_do} of {total} runs still to do" if to_do else f"ledger   all {total} runs done: nothing to run"


def _verl_checked(spec, plan) -> bool:
    """True when cells run on verl, after checking that verl can run every one (exit 2 if not)."""
    from dapo_ablate.ablation.runtime.backends.verl import VerlTranslationError
    from dapo_ablate.ablation.runtime.backends.verl_plan import uses_verl, verl_jobs

    if not uses_verl(plan):
        return False
    try:
        verl_jobs(spec, plan)
    except VerlTranslationError as err:
        fail(str(err))
    return True


def status(spec_path: Path = SPEC_ARG, overrides: Optional[list[str]] = OVERRIDES_ARG) -> None:
    """Print the runs table of the experiment: cell, seed, status, attempts, metric, wall time, the
    Ray job of cells run as jobs (verl), error."""
    from rich.console import Console
    from rich.table import Table

    from dapo_ablate.ablation.store.results import status_rows

    spec, plan = _plan(spec_path, overrides)
    try:
        rows, counts = status_rows(spec, plan)
    except USER_ERRORS as err:
        fail(str(err))
    table = Table(title=f"{spec.name} ({plan.design}, {len(rows)} runs)")
    jobs = any(row["job_id"] for row in rows)  # cells run as Ray jobs (verl): their ids, to inspect with `ray job`
    for column in ("cell", "seed", "status", "attempts", spec.metric, "wall", *(("job",) if jobs else ()), "error"):
        table.add_column(column, overflow="fold")
    for row in rows:
        value = row["metric"]
        table.add_row(
            row["label"], str(row["seed"]), row["status"], str(row["attempts"]),
            "" if value is None else f"{value:.3f}", "" if row["wall_s"] is None else f"{row['wall_s']:.1f} s",
            *((row["job_id"] or "",) if jobs else ()), row["error"] or "",
        )
    Console(width=max(120, Console().width)).print(table)
    typer.echo("  ".join(f"{name} {count}" for name, count in counts.items()))


def ui(
    spec_path: Path = SPEC_ARG,
    overrides: Optional[list[str]] = OVERRIDES_ARG,
    port: int = typer.Option(5000, "--port", help="Port of the MLflow UI on 127.0.0.1."),
) -> None:
    """Serve the MLflow UI of the experiment's tracking store on 127.0.0.1.

    A copied or moved store (a `dapo-runs/` copied elsewhere) has its artifact locations moved to
    its own folder first, so the UI shows the copy's artifacts, not the original's."""
    from dapo_ablate.ablation.store.tracking import mlflow_ui_command, rebase_artifacts, sqlite_path

    spec, _ = _plan(spec_path, overrides)
    store = sqlite_path(spec.tracking.uri)
    if store is not None and not store.is_file():
        fail(f"no MLflow store at {spec.tracking.uri} yet; run `dapo-ablate run {spec_path}` first")
    rebase_artifacts(spec.tracking.uri)
    command = mlflow_ui_command(spec.tracking.uri, port)
    typer.echo(f"MLflow UI for {spec.name}: http://127.0.0.1:{port}  (Ctrl-C stops it)")
    raise typer.Exit(serve(command))


def serve(command: list[str]) -> int:
    """Run the UI server until it stops or this command is interrupted (Ctrl-C, SIGTERM); then
    stop the server and every process it started (uvicorn and job workers); its exit status."""
    server = subprocess.Popen(command, start_new_session=True)  # its own group, stopped as one
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return server.wait()
    except KeyboardInterrupt:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    """Add run, validate, status and ui to the dapo-ablate app."""
    for name, command in (("run", run), ("validate", validate), ("status", status), ("ui", ui)):
        app.command(name, epilog=SPEC_OVERRIDES_EPILOG)(command)
