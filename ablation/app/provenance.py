"""What produced a report, in the lines it opens with: the experiment and how far it got, the spec
and the command line's overrides, the trainer config's differences from its base file, the model
and data, what is held on in every run, the stores, the versions and the date; and for a results
CSV, the file. `origin` is what `run` records beside the experiment's spec (`executor.ORIGIN_RECORD`).
"""

from __future__ import annotations

import hashlib
import platform
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.app.texts import command_line
from dapo_ablate.ablation.experiment.identity import IDENTITY_VERSION
from dapo_ablate.ablation.experiment.spec import run_root
from dapo_ablate.ablation.runtime.executor import read_origin
from dapo_ablate.ablation.store.tracking import flatten
from dapo_ablate.core.config import BUILTIN, ConfigError, TrainerConfig, build_trainer_config, read_yaml
from dapo_ablate.core.contracts import SHORT_LABELS, TECHNIQUES

if TYPE_CHECKING:
    from dapo_ablate.ablation.app.specs import Experiment
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

MAX_DIFFERENCES = 12
"""Differences from the base trainer file listed by name; more are counted."""


def origin_of(experiment: Experiment) -> dict[str, Any]:
    """Where `run` was asked to take the spec from: the spec file, the command line's overrides and,
    when the spec names its trainer by file, that file (all absolute)."""
    origin: dict[str, Any] = {"spec": str(experiment.path.resolve()), "overrides": list(experiment.overrides),
                              "command": command_line("run", experiment.path, experiment.overrides)}
    if experiment.path.is_file():
        try:
            trainer = read_yaml(experiment.path).get("trainer")
        except (ConfigError, AttributeError):
            trainer = None
        if isinstance(trainer, str):
            origin["trainer_file"] = str((experiment.path.resolve().parent / trainer).resolve())
    return origin


def held_on(spec: ExperimentSpec) -> tuple[str, ...]:
    """The techniques the base trainer config keeps on in every run (not factors), by label."""
    factors = set(spec.factor_names)
    techniques = spec.trainer.techniques
    return tuple(SHORT_LABELS[name] for name in TECHNIQUES if name not in factors and getattr(techniques, name))


def experiment_provenance(experiment: Experiment, done: int, parent_run_id: str | None = None) -> tuple[str, ...]:
    """The lines a report of `experiment` opens with (module docstring)."""
    spec, plan = experiment.spec, experiment.plan
    folder = run_root(spec)
    origin = read_origin(folder) or origin_of(experiment)
    seeds = ", ".join(map(str, plan.seeds))
    settings = f", {len(plan.settings)} settings ({', '.join(plan.settings)})" if plan.settings else ""
    lines = [
        f"Experiment {spec.name}: {plan.design} design over {len(plan.factors)} factors{settings}, seeds {seeds}; "
        f"{done} of {len(plan.runs)} planned runs done; metric {spec.metric}.",
        f"Spec: {origin.get('command') or command_line('run', experiment.path, experiment.overrides)}"
        + (f", run {origin['recorded']}" if origin.get("recorded") else "")
        + f"; its resolved record is {folder / 'spec.yaml'} (a copy: spec.yaml in this folder).",
        _trainer_line(spec.trainer),
        _base_line(spec.trainer, origin.get("trainer_file")),
    ]
    held = held_on(spec)
    if held:
        lines.append(f"Held on in every run (not factors, from the base config): {', '.join(held)}; the baseline cell "
                     "has them on.")
    parent = f" (parent run {parent_run_id})" if parent_run_id else ""
    lines.append(f"Stores: ledger {spec.ledger}; MLflow {spec.tracking.uri}{parent}; run folders under {folder}.")
    lines.append(versions_line())
    return tuple(lines)


def results_provenance(path: Path, rows: int) -> tuple[str, ...]:
    """The lines a report of a results CSV opens with."""
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        digest = "unreadable"
    return (f"Results: {path.resolve()} ({rows} runs, sha256 {digest}...); the spec, trainer and stores behind them are "
            "not known to this report.", versions_line())


def versions_line() -> str:
    """dapo-ablate and its run-id scheme, Python, torch, transformers; the date."""
    packages = ", ".join(f"{name} {_version(name)}" for name in ("torch", "transformers"))
    return (f"Versions: dapo-ablate {_version('dapo-ablate')} (run ids v{IDENTITY_VERSION}), Python "
            f"{platform.python_version()}, {packages}; report made {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _trainer_line(trainer: TrainerConfig) -> str:
    model = trainer.model
    if model.path == BUILTIN:
        shown = f"the built-in {model.builtin_size} policy (warm-start {model.builtin_warmup_steps} steps)"
    else:
        shown = model.path
    data = trainer.data
    source = (f"the built-in {data.builtin_task} task" if data.train == BUILTIN
              else f"{data.train} (evaluation: {data.eval})")
    schedule, batch, rollout = trainer.schedule, trainer.batch, trainer.rollout
    return (f"Trainer: backend {trainer.backend}, model {shown}, data {source}; {schedule.total_steps} steps of "
            f"{batch.prompts_per_step} prompts x {trainer.algorithm.group_size} samples, responses up to "
            f"{rollout.max_response_len} tokens; evaluation every {schedule.eval_every} steps, k = {rollout.eval_k}.")


def _base_line(trainer: TrainerConfig, trainer_file: str | None) -> str:
    """The resolved trainer config's differences from its base file (the overrides), or from the
    trainer's defaults when the base is inline or its file is gone."""
    base, what = None, "the trainer's defaults (the spec's trainer is inline)"
    if trainer_file:
        try:
            base = build_trainer_config(read_yaml(Path(trainer_file)), source=trainer_file)
            what = f"its base file {trainer_file}"
        except (ConfigError, OSError):
            what = f"the trainer's defaults (its base file {trainer_file} no longer loads)"
    before = flatten((base or TrainerConfig()).to_dict())
    after = flatten(trainer.to_dict())
    changed = [f"{key} {before.get(key, '(absent)')} -> {after.get(key, '(absent)')}"
               for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
    if not changed:
        return f"Trainer config: as {what}, nothing overridden."
    shown = "; ".join(changed[:MAX_DIFFERENCES]) + (f"; and {len(changed) - MAX_DIFFERENCES} more" if len(changed) > MAX_DIFFERENCES else "")
    return f"Trainer config: differs from {what} in {shown}."
