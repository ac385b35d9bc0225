"""``dapo-ablate run | validate | status | ui SPEC.yaml``: the factorial scheduler's commands.

Each parses its options and calls one library function; a user's mistake (a bad spec, an
unreachable database or Ray address, an unwritable folder) is one sentence on stderr with exit
status 2, and nothing is written. SPEC is a spec file (with KEY=VALUE overrides after it) or the
experiment folder OUTPUT_DIR/NAME where `run` recorded the spec it ran. The app layer is
imported inside each command, so that `--help` loads none of it (benchmarks/cli_startup.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Optional

import typer

from dapo_ablate.ablation.app import texts
from dapo_ablate.ablation.app.errors import Interrupted, UserError

from .common import user_facing

SPEC_ARG = typer.Argument(..., help=texts.SPEC_HELP, show_default=False)
TARGET_ARG = typer.Argument(..., help=texts.TARGET_HELP, show_default=False)
OVERRIDES_ARG = typer.Argument(None, help=texts.SPEC_OVERRIDES_HELP, show_default=False)


@user_facing
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
    from dapo_ablate.ablation.app import experiment as app

    experiment = app.load_experiment(spec_path, overrides)
    if dry_run:
        _echo_lines(app.validate(experiment, address).lines())
        return
    spec = experiment.spec
    try:
        outcome = app.run(experiment, address, app.RunOptions(progress, max_concurrent, retry_failed))
    except Interrupted as stopped:  # Ctrl-C or SIGTERM during the checks or Ray's start
        typer.echo(f"{spec.name}: {stopped}", err=True)
        raise typer.Exit(stopped.exit_code) from None
    summary, counts = outcome.summary, outcome.summary.counts
    typer.echo(
        f"{spec.name}: {counts['done']}/{sum(counts.values())} runs done ({summary.finished} now, "
        f"{summary.already_done} before), {counts['failed']} failed, {counts['pending'] + counts['running']} "
        f"not finished{held_note(summary.held)}; {summary.wall_s:.0f} s. Browse: {outcome.browse}"
    )
    for name, error in summary.failures.items():
        typer.echo(f"  failed {name}: {error}", err=True)
    if summary.interrupted:
        typer.echo("interrupted: runs in flight were put back to pending; run the command again to resume", err=True)
    elif outcome.headline is not None:  # every run done: the headline went on the MLflow parent (as `report` puts it)
        typer.echo(outcome.headline)
    raise typer.Exit(summary.exit_code)


def held_note(held: int) -> str:
    """What the summary line adds for runs another driver holds (exit 0 when they are all that is left)."""
    if not held:
        return ""
    return f" ({held} held by another driver, which finishes {'it' if held == 1 else 'them'}; `status` shows when)"


@user_facing
def validate(
    spec_path: Path = SPEC_ARG,
    overrides: Optional[list[str]] = OVERRIDES_ARG,
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address to check."),
) -> None:
    """Check the spec, its folders and Ray address, and print the plan (writes nothing)."""
    from dapo_ablate.ablation.app import experiment as app

    _echo_lines(app.validate(app.load_experiment(spec_path, overrides), address).lines())


def _echo_lines(lines: list[str]) -> None:
    for line in lines:
        typer.echo(line)


@user_facing
def status(spec_path: Path = TARGET_ARG, overrides: Optional[list[str]] = OVERRIDES_ARG) -> None:
    """Print the runs table of the experiment: cell, seed, status, attempts, metric, wall time, the
    Ray job of cells run as jobs (verl), error. Of a sweep: its trials (state, value, knob values,
    time, error), the count in each state and the best trial so far."""
    from rich.console import Console
    from rich.table import Table

    from dapo_ablate.ablation.app import experiment as app

    if app.names_a_sweep(spec_path):
        return _sweep_status(spec_path, overrides)
    experiment = app.load_experiment(spec_path, overrides)
    spec, found = experiment.spec, app.status(experiment)
    table = Table(title=f"{spec.name} ({experiment.plan.design}, {len(found.rows)} runs)")
    jobs = found.has_jobs
    header, shown = app.status_metric_column(spec.metric)
    for column in ("cell", "seed", "status", "attempts", header, "wall", *(("job",) if jobs else ()), "error"):
        table.add_column(column, overflow="fold")
    for row in found.rows:
        table.add_row(
            row["label"], str(row["seed"]), row["status"], str(row["attempts"]),
            shown(row["metric"]), "" if row["wall_s"] is None else f"{row['wall_s']:.1f} s",
            *((row["job_id"] or "",) if jobs else ()), row["error"] or "",
        )
    Console(width=max(120, Console().width)).print(table)
    typer.echo("  ".join(f"{name} {count}" for name, count in found.counts.items()))
    for line in found.looks:
        typer.echo(line)
    if found.answer:
        typer.echo(found.answer)
    if found.note:
        typer.echo(found.note)


def _sweep_status(spec_path: Path, overrides: Optional[list[str]]) -> None:
    """`status` of a sweep: its trials table, the count in each state and the best so far."""
    from rich.console import Console
    from rich.table import Table

    from dapo_ablate.ablation.app import sweep as app

    found = app.sweep_status(app.load_sweep(spec_path, overrides), texts.command_line("sweep", spec_path, overrides or ()))
    table = Table(title=found.title)
    for column in found.trials.frame.columns:
        table.add_column(column, overflow="fold", justify="right" if column in found.trials.numeric else "left")
    for row in found.trials.frame.itertuples(index=False):
        table.add_row(*row)
    Console(width=max(120, Console().width)).print(table)
    for line in found.lines:
        typer.echo(line)


@user_facing
def ui(
    spec_path: Path = TARGET_ARG,
    overrides: Optional[list[str]] = OVERRIDES_ARG,
    port: int = typer.Option(5000, "--port", min=0, max=65535, help="Port of the MLflow UI on 127.0.0.1 (1-65535; 0: a free one, named in the link)."),
) -> None:
    """Serve the MLflow UI of the experiment's tracking store on 127.0.0.1 and, once it answers,
    print the link to the experiment's runs: ranked by the spec's metric, with each factor's level
    and the headline as columns (a sweep's: its trials by the metric, with each knob's value).

    A copied or moved store (a `dapo-runs/` copied elsewhere) has its artifact locations moved to
    its own folder first, so the UI shows the copy's artifacts, not the original's."""
    from dapo_ablate.ablation.app import experiment as app

    if app.names_a_sweep(spec_path):
        from dapo_ablate.ablation.app import sweep as sweeps

        spec = sweeps.load_sweep(spec_path, overrides)
        name, server = spec.name, sweeps.sweep_ui_server(spec, port, texts.command_line("sweep", spec_path, overrides or ()))
    else:
        experiment = app.load_experiment(spec_path, overrides)
        name, server = experiment.spec.name, app.ui_server(experiment, port)
    if server.note:
        typer.echo(f"note: {server.note}")
    typer.echo(f"Starting the MLflow UI of {name}: waiting until it answers on "
               f"{app.UI_HOST}:{server.port} (a first start takes up to a minute) ...")
    answered, stopped, impostor = threading.Event(), threading.Event(), threading.Event()
    running: list[subprocess.Popen] = []
    watcher = threading.Thread(target=_announce, args=(app, server, answered, stopped, (impostor, running)), daemon=True)
    watcher.start()
    status = serve(server.command, running)
    stopped.set()
    watcher.join()
    if impostor.is_set():
        raise UserError(f"something else answers on {app.UI_HOST}:{server.port}, not the MLflow UI of this store (another "
                        "program took the port while the server started); the link was not printed: choose another with --port")
    if status != 0 and not answered.is_set():
        raise UserError(f"the MLflow server stopped before it answered on {app.UI_HOST}:{port}; "
                        "its own messages above say why")
    raise typer.Exit(status)


def _announce(app: Any, server: Any, answered: threading.Event, stopped: threading.Event,
              impostor: tuple[threading.Event, list[subprocess.Popen]]) -> None:
    """Print the link once the server answers (unless it stopped first) and shows this store; when
    another program answers on the port, no link: the event is set and the server stopped."""
    if app.wait_for_ui(server, stopped):
        if not app.serves_this_store(server):
            found, running = impostor
            found.set()
            for process in running:  # `serve` then returns
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
            return
        answered.set()
        typer.echo(f"MLflow UI of {server.opens} (Ctrl-C stops it):\n{server.link}")
        typer.echo(WORKFLOW_NOTE)


WORKFLOW_NOTE = ("(a run's own page opens in MLflow's GenAI view while this browser has not picked a workflow: "
                 "pick 'Model training' once in the UI's workflow switch and the browser keeps it)")


SERVER_ENV = {"UVICORN_ACCESS_LOG": "false", "UVICORN_LOG_LEVEL": "warning", "MLFLOW_LOGGING_LEVEL": "WARNING",
              "PYTHONWARNINGS": "ignore"}
"""The MLflow server's own chatter kept off the console, so the link `ui` prints stays in view: no
line per request, no INFO lines (uvicorn's start-up, MLflow's job schedulers), no deprecation
warnings of its dependencies; its warnings and errors still show."""


def serve(command: list[str], running: list[subprocess.Popen] | None = None) -> int:
    """Run the UI server until this command is interrupted (Ctrl-C, SIGTERM: 0, once the server
    and every process it started, uvicorn and job workers, stopped) or the server stops by itself:
    a failure, its exit status or 1 (`mlflow ui` exits 0 even when its uvicorn failed to start)."""
    # its own process group, stopped as one
    server = subprocess.Popen(command, start_new_session=True, env={**SERVER_ENV, **os.environ})  # the user's own settings win
    if running is not None:
        running.append(server)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return server.wait() or 1
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


def register(cli: typer.Typer) -> None:
    """Add run, validate, status and ui to the dapo-ablate app."""
    for name, command in (("run", run), ("validate", validate), ("status", status), ("ui", ui)):
        cli.command(name, epilog=texts.SPEC_OVERRIDES_EPILOG)(command)
