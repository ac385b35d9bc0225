"""What one trial trains, and what its runs add up to.

A trial is a knob setting sampled by Optuna. It trains, at seeds 0..n-1 (``seeds_per_trial``):

- plain sweep: the base trainer with the knobs set (one cell);
- robustness mode (``factors:``): the factors' cells on top of that setting: ``pairs``, the
  full-on cell plus each factor's leave-one-out cell; ``full``, all 2^k combinations.

Each cell x seed is an ordinary `PlannedRun` whose id hashes its resolved config (`make_run_id`),
so a run another trial or a factorial already trained is found in the ledger, not trained again.

The trial's value is the objective metric of the full-on cell, averaged over seeds; so is each
intermediate value the pruner sees. A factor's effect at this knob setting is, per seed,
``pairs``: Y(full-on) - Y(full-on without the factor), the drop from leaving it out of the recipe;
``full``: mean Y over cells with the factor on - mean Y over cells with it off (the factorial
main effect). The effect is the mean over seeds, with a 95% t interval over seeds (n >= 2).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dapo_ablate.ablation.experiment.design import (
    Cell,
    Factor,
    PlannedRun,
    baseline_label,
    cell_config,
    factors_of,
    full_cells,
)
from dapo_ablate.ablation.experiment.identity import make_run_id
from dapo_ablate.core.config import TrainerConfig, build_trainer_config, set_dotted
from dapo_ablate.sweeps.knobs import format_params  # the knobs as the console and the report show them
from dapo_ablate.sweeps.spec import SweepSpec

CI_LEVEL = 0.95


@dataclass(frozen=True)
class TrialPlan:
    """The runs of one trial and which of them make its objective."""

    number: int
    params: dict[str, Any]
    """Knob leaf name -> sampled value."""
    config: TrainerConfig
    """The base trainer with the knobs set (before the factors' levels and the seed)."""
    factors: list[Factor]
    runs: list[PlannedRun]
    full_on: Cell
    """The cell whose metric is the trial's value (every factor on; the only cell without factors)."""

    @property
    def objective_runs(self) -> list[PlannedRun]:
        return [run for run in self.runs if run.cell == self.full_on]

    @property
    def by_id(self) -> dict[str, PlannedRun]:
        return {run.run_id: run for run in self.runs}


def sweep_factors(spec: SweepSpec) -> list[Factor]:
    """The robustness factors as `Factor`s (none for a plain sweep)."""
    return factors_of(spec) if spec.factors else []  # type: ignore[arg-type]  # reads only .factors


def trial_cells(k: int, design: str) -> list[Cell]:
    """Full-on first, then the leave-one-out cells (pairs) or the rest of the factorial (full)."""
    full_on = Cell((1,) * k)
    if design == "full":
        return [full_on] + [cell for cell in full_cells(k) if cell != full_on]
    return [full_on] + [Cell(tuple(int(j != i) for j in range(k))) for i in range(k)]


def plan_trial(spec: SweepSpec, number: int, params: Mapping[str, Any]) -> TrialPlan:
    """The runs of trial `number` at knob setting `params`; ConfigError if the trainer refuses it."""
    data = spec.trainer.to_dict()
    for leaf, path in spec.knob_paths.items():
        set_dotted(data, path, params[leaf])
    config = build_trainer_config(data, source=f"trial {number} ({format_params(params)})")
    factors = sweep_factors(spec)
    cells = trial_cells(len(factors), spec.factor_design)
    baseline = baseline_label(config, factors)
    runs = []
    for cell in cells:
        for seed in spec.seeds:
            run_config = cell_config(config, factors, cell, seed)
            levels = {f.name: level for f, level in zip(factors, cell.levels)}
            label = f" {cell.label(factors, baseline)}" if factors else ""
            runs.append(PlannedRun(make_run_id(levels, run_config, seed), cell, seed, run_config,
                                   f"trial {number}{label} s{seed}", levels))
    return TrialPlan(number, dict(params), config, factors, runs, cells[0])


# ------------------------------------------------------------------------------------ outcome
@dataclass(frozen=True)
class Effect:
    """One factor's effect at one knob setting: mean over seeds with a t interval."""

    mean: float
    ci_low: float | None
    ci_high: float | None
    per_seed: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.per_seed)

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci_low": self.ci_low, "ci_high": self.ci_high, "n": self.n, "per_seed": self.per_seed}


def mean_with_ci(values: Sequence[float], level: float = CI_LEVEL) -> Effect:
    """Mean and two-sided t interval (None with fewer than two values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Effect(mean, None, None, list(values))
    from scipy.stats import t

    half = t.ppf(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Effect(mean, mean - half, mean + half, list(values))


def trial_value(plan: TrialPlan, metric_of: Mapping[str, float]) -> float:
    """Mean over seeds of the full-on cell's metric (`metric_of`: run id -> metric)."""
    return statistics.fmean(metric_of[run.run_id] for run in plan.objective_runs)


def factor_effects(plan: TrialPlan, metric_of: Mapping[str, float], design: str) -> dict[str, Effect]:
    """Each factor's effect at this knob setting (see the module docstring), paired by seed."""
    value = {(run.cell, run.seed): metric_of[run.run_id] for run in plan.runs}
    seeds = sorted({run.seed for run in plan.runs})
    effects = {}
    for i, factor in enumerate(plan.factors):
        per_seed = []
        for seed in seeds:
            if design == "full":
                on = [v for (cell, s), v in value.items() if s == seed and cell.levels[i]]
                off = [v for (cell, s), v in value.items() if s == seed and not cell.levels[i]]
                per_seed.append(statistics.fmean(on) - statistics.fmean(off))
            else:
                without = Cell(tuple(int(j != i) for j in range(len(plan.factors))))
                per_seed.append(value[(plan.full_on, seed)] - value[(without, seed)])
        effects[factor.name] = mean_with_ci(per_seed)
    return effects
