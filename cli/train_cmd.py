"""`dapo-ablate train CONFIG.yaml --out DIR`: one configuration, with verl's per-step console lines,
a progress bar on a terminal and, with --tracking, an MLflow run (the app layer, and with it
pydantic and torch, is imported inside the command)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

import typer

from .common import user_facing


@user_facing
def train(
    config: Path = typer.Argument(..., help="TrainerConfig YAML (see examples/dapo_cpu.yaml)."),
    overrides: Optional[list[str]] = typer.Argument(
        None, help="key=value overrides of the config, e.g. schedule.total_steps=5 algorithm.eps_high=0.3."
    ),
    out: Path = typer.Option(Path("dapo-runs/train"), "--out", help="Folder for result.json and checkpoints."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from a checkpoint in --out."),
    force: bool = typer.Option(
        False, "--force", help="Start over in an --out that holds a result (of another config, or of this one)."
    ),
    log_every: int = typer.Option(
        1, "--log-every", min=0, help="Print verl's `step:N - name:value` line every N steps (and at each evaluation "
        "and the last step); 0: none."
    ),
    tracking: Optional[str] = typer.Option(
        None, "--tracking", help="MLflow tracking URI to log the run to, e.g. sqlite:///dapo-runs/mlflow.db."
    ),
    experiment: Optional[str] = typer.Option(
        None, "--experiment", help="MLflow experiment of the run (default: the config file's name)."
    ),
    progress: bool = typer.Option(
        True, "--progress/--no-progress", help="Show a progress bar (on a terminal); --no-progress shows none, "
        "transformers' weight-loading bar included."
    ),
) -> None:
    """Train one configuration and write DIR/result.json."""
    from dapo_ablate.ablation.app import train as app

    cfg = app.load_config(config, overrides)
    app.check_inputs(cfg)
    options = app.TrainOptions(resume=resume, force=force, tracking_uri=tracking, experiment=experiment or config.stem)
    with app.weight_loading_bars_off(), _progress(progress and sys.stdout.isatty(), cfg.schedule.total_steps) as bar:
        lines = app.StepLines(cfg, log_every, bar.write)
        result = app.train(cfg, out, options, callbacks=[bar.callback, lines], say=bar.write)
    k = cfg.rollout.eval_k
    first, last = result.eval[0], result.eval[-1]
    typer.echo(
        f"avg@{k} {100 * first[f'avg@{k}']:.1f} -> {100 * last[f'avg@{k}']:.1f} pp  pass@{k} {100 * last[f'pass@{k}']:.1f} pp  "
        f"maj@{k} {100 * last[f'maj@{k}']:.1f} pp  tokens {result.tokens_generated:,} ({result.tokens_discarded:,} discarded)  "
        f"{result.wall_s:.1f} s  -> {out / 'result.json'}"
    )


class _progress:
    """A rich progress bar fed by the trainer's callback, with `write` printing lines above it; or,
    disabled, a no-op callback and `write` to stdout."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total
        self.write: Callable[[str], None] = typer.echo
        self.callback: Callable[[str, int, dict], None] = lambda kind, step, data: None

    def __enter__(self) -> "_progress":
        if not self.enabled:
            return self
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TimeRemainingColumn(),
        )
        self.bar.start()
        task = self.bar.add_task("train", total=self.total, info="")
        state = {"eval": ""}

        def callback(kind: str, step: int, data: dict) -> None:
            if kind == "eval":
                key = next(k for k in data if k.startswith("avg@"))
                state["eval"] = f"{key} {100 * data[key]:.1f} pp"
                self.bar.update(task, info=f"acc {100 * data[key]:.0f} pp | {state['eval']}")
            else:
                self.bar.update(task, completed=step, info=f"acc {100 * data['accuracy']:.0f} pp | {state['eval']}")

        self.callback = callback
        self.write = lambda line: self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.stop()
        return False


def register(cli: typer.Typer) -> None:
    cli.command("train")(train)
