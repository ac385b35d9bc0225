"""The plan printout of ``dapo-ablate sweep --dry-run``: what the sweep will search and roughly
what it costs (an upper bound: pruned trials stop early)."""

from __future__ import annotations

import os

from dapo_ablate.ablation.experiment.design import estimate_run_seconds
from dapo_ablate.core.config import BUILTIN
from dapo_ablate.sweeps.spec import Dimension, SweepSpec
from dapo_ablate.sweeps.study import storage_url
from dapo_ablate.sweeps.trials import sweep_factors, trial_cells


def describe_dimension(dim: Dimension) -> str:
    if dim.type == "categorical":
        return "one of " + ", ".join(map(repr, dim.choices or []))
    text = f"{dim.type} in [{dim.low:g}, {dim.high:g}]"
    if dim.log:
        text += ", log scale"
    if dim.step is not None:
        text += f", step {dim.step:g}"
    return text


def format_sweep_plan(spec: SweepSpec, n_trials: int | None = None) -> str:
    trials = n_trials or spec.n_trials or 0
    factors = sweep_factors(spec)
    cells = len(trial_cells(len(factors), spec.factor_design))
    runs_per_trial = cells * spec.seeds_per_trial
    executor = spec.executor
    cpus = os.cpu_count() or 1
    parallel = max(1, int(cpus // executor.cpus_per_run)) if executor.cpus_per_run > 0 else cpus
    if executor.max_concurrent is not None:
        parallel = executor.max_concurrent if executor.address else min(parallel, executor.max_concurrent)
    seconds = estimate_run_seconds(spec.trainer)
    total = trials * runs_per_trial * seconds
    lines = [f"sweep {spec.name}: {spec.direction} {spec.metric} over {trials} trials", "space:"]
    lines += [f"  {leaf:<24} {describe_dimension(dim)}" for leaf, dim in spec.space.items()]
    sampler, pruner = spec.sampler, spec.pruner
    lines.append(f"sampler: {sampler.type} (seed {sampler.seed})   pruner: {pruner.type} on intermediate {spec.metric}")
    if factors:
        lines.append(f"robustness: factors {', '.join(f.name for f in factors)} ({spec.factor_design}: {cells} cells per trial); "
                     "the trial's value is the full-on cell's")
    lines.append(f"per trial: {runs_per_trial} run{'s' * (runs_per_trial != 1)} ({cells} cell{'s' * (cells != 1)} x {spec.seeds_per_trial} seed"
                 f"{'s' * (spec.seeds_per_trial != 1)})")
    estimate = f"about {seconds:.0f} s per run" + (" (CPU estimate of the built-in model)" if spec.trainer.model.path == BUILTIN
                                                    else " (scaled from the CPU quickstart: measure a real model)")
    lines.append(f"compute: at most {trials * runs_per_trial} runs, {estimate}; {parallel} at a time: "
                 f"at most {total / parallel / 60:.1f} min (pruning stops some trials early)")
    lines.append(f"study + ledger: {spec.ledger}   MLflow: {spec.tracking.uri}   outputs: {spec.output_dir}")
    lines.append(f"browse: optuna-dashboard {storage_url(spec.ledger)}   |   mlflow ui --backend-store-uri {spec.tracking.uri}")
    return "\n".join(lines)
