"""`dapo-ablate train CONFIG.yaml --out DIR`: one configuration, with a progress bar (the app
layer, and with it pydantic and torch, is imported inside the command)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

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
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Train one configuration and write DIR/result.json."""
    from dapo_ablate.ablation.app import train as app

    cfg = app.load_config(config, overrides)
    app.check_inputs(cfg)
    with _progress(progress, cfg.schedule.total_steps) as callback:
        result = app.train(cfg, out, resume=resume, callbacks=[callback])
    k = cfg.rollout.eval_k
    first, last = result.eval[0], result.eval[-1]
    typer.echo(
        f"avg@{k} {first[f'avg@{k}']:.3f} -> {last[f'avg@{k}']:.3f}  pass@{k} {last[f'pass@{k}']:.3f}  "
        f"maj@{k} {last[f'maj@{k}']:.3f}  tokens {result.tokens_generated:,} ({result.tokens_discarded:,} discarded)  "
        f"{result.wall_s:.1f} s  -> {out / 'result.json'}"
    )


class _progress:
    """A rich progress bar fed by the trainer's callback (or a no-op)."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total

    def __enter__(self):
        if not self.enabled:
            return lambda kind, step, data: None
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # its "Loading weights" bar would break the rich display
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
                state["eval"] = f"{key} {data[key]:.3f}"
                self.bar.update(task, info=f"acc {data[key]:.2f} | {state['eval']}")
            else:
                self.bar.update(task, completed=step, info=f"acc {data['accuracy']:.2f} | {state['eval']}")

        return callback

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.stop()
        return False


def register(cli: typer.Typer) -> None:
    cli.command("train")(train)
