"""`dapo-ablate train CONFIG.yaml --out DIR`: one configuration, with a progress bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dapo_ablate.core.config import ConfigError, load_trainer_config
from dapo_ablate.core.data import DataError

from dapo_ablate.ablation.experiment.overrides import OverrideError, dotted_keys, parse_overrides, unknown_key_sentence


def fail(message: str) -> None:
    """Print a user's mistake as one sentence and exit with status 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def check_writable(out: Path) -> None:
    """Refuse an output folder that cannot be created or written, before any work starts."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        fail(f"output folder {str(out)!r} is not writable ({err.strerror}); choose another --out")


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
    try:
        cfg = load_trainer_config(config)
        cfg = apply_overrides(cfg, overrides)
    except (ConfigError, OverrideError) as err:
        fail(str(err))
    check_writable(out)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    from dapo_ablate.core.trainer import train as run_training

    with _progress(progress, cfg.schedule.total_steps) as callback:
        try:
            result = run_training(cfg, out, callbacks=[callback], resume=resume)
        except DataError as err:
            fail(str(err))
    k = cfg.rollout.eval_k
    first, last = result.eval[0], result.eval[-1]
    typer.echo(
        f"avg@{k} {first[f'avg@{k}']:.3f} -> {last[f'avg@{k}']:.3f}  pass@{k} {last[f'pass@{k}']:.3f}  "
        f"maj@{k} {last[f'maj@{k}']:.3f}  tokens {result.tokens_generated:,} ({result.tokens_discarded:,} discarded)  "
        f"{result.wall_s:.1f} s  -> {out / 'result.json'}"
    )


def apply_overrides(cfg, overrides: list[str] | None):
    """The config with command-line key=value overrides, validated like the file."""
    values = parse_overrides(overrides)
    if not values:
        return cfg
    try:
        return cfg.with_overrides(values)
    except KeyError as err:
        raise OverrideError(unknown_key_sentence(err.args[0], dotted_keys(cfg.to_dict()))) from None


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


def register(app: typer.Typer) -> None:
    app.command("train")(train)
