"""``plan-seeds``: seeds per cell for a wanted power in each claims family, before booking GPUs;
the run noise from a pilot (an experiment's results or a CSV) or given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dapo_ablate.ablation.app.errors import UserError, user_errors
from dapo_ablate.ablation.app.specs import load_experiment
from dapo_ablate.ablation.app.units import is_accuracy, metric_units  # noqa: F401 - is_accuracy: the CLI's
from dapo_ablate.ablation.experiment.spec import SpecError
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.results import ResultsError, load_experiment_results
from dapo_ablate.core.config import ConfigError
from dapo_ablate.core.contracts import DEFAULT_METRIC
from dapo_ablate.reports import ReportInputError, load_results_csv
from dapo_ablate.reports.power import pilot_sigma
from dapo_ablate.reports.power import plan_seeds as seeds_table


@dataclass(frozen=True)
class SeedsRequest:
    """The pilot: an experiment `spec` (a spec file with its command-line `overrides`, or the
    experiment folder its `run` recorded the spec in), a results CSV `results`, or `sd` with
    `factors`; the effect size to detect, the power wanted, and the report's confidence and
    adjustment. `effect` and `sd` are in pp for an accuracy metric (`units`)."""

    effect: float
    spec: Path | None = None
    results: Path | None = None
    sd: float | None = None
    metric: str | None = None
    factors: list[str] | None = None
    power: float = 0.8
    confidence: float = 0.95
    adjust: str = "holm"
    overrides: list[str] | None = None


@dataclass(frozen=True)
class SeedPlan:
    table: pd.DataFrame
    metric: str
    sd: float
    source: str
    """Where the sd came from: the pilot's seeds, or --sd."""


def plan_seeds(request: SeedsRequest) -> SeedPlan:
    """`effect` and `sd` are typed in pp for an accuracy metric (`units`); the plan's sd comes back
    in the metric's stored units."""
    with user_errors(ReportInputError, SpecError, ConfigError):
        names, metric, pilot = _pilot(request)
        if not names:
            raise UserError("no factors: pass --factors a,b,... with --sd")
        effect = metric_units("--effect", request.effect, metric)
        if request.sd is not None:
            sd, source = metric_units("--sd", request.sd, metric), "--sd"
        else:
            sd, source = pilot_sigma(pilot, names, metric)
        table = seeds_table(names, sd, effect, request.power, 1 - request.confidence, request.adjust)
    return SeedPlan(table, metric, sd, source)


def _pilot(request: SeedsRequest) -> tuple[list[str] | None, str, pd.DataFrame | None]:
    """(factors, metric, pilot results or None)."""
    metric = request.metric or DEFAULT_METRIC
    if request.results is not None:
        pilot, names = load_results_csv(request.results, request.factors, metric)
        return names, metric, pilot
    if request.spec is None:
        return request.factors, metric, None
    experiment = load_experiment(request.spec, request.overrides)
    spec = experiment.spec
    metric = request.metric or spec.metric
    try:
        results, factors, *_ = load_experiment_results(spec)
        return factors, metric, results
    except (ResultsError, LedgerError) as error:
        if request.sd is None:
            raise UserError(f"{error}; without pilot results, pass --sd (the run-to-run sd of {metric})") from None
        return [factor.name for factor in experiment.plan.factors], metric, None
