"""``plan-seeds``: seeds per cell for a wanted power in each claims family, before booking GPUs;
the run noise from a pilot (an experiment's results or a CSV) or given. With two or more
settings (a spec's, a pilot's `setting` column, or `--settings`), a transfer study: seeds per
cell for the report's "transfers" and "differs" verdicts from each setting's own noise, and what
given seeds buy (``reports.transfer_power``)."""

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
from dapo_ablate.core.contracts import DEFAULT_METRIC, SETTING_COLUMN
from dapo_ablate.reports import ReportInputError, load_results_csv
from dapo_ablate.reports import transfer_power
from dapo_ablate.reports.power import MAX_SEEDS, pilot_sigma
from dapo_ablate.reports.power import plan_seeds as seeds_table

DEFAULT_MARGIN_PP = 2.0
"""`report --equivalence-margin`'s default, in pp: a transfer plan sizes the verdict the report gives."""


@dataclass(frozen=True)
class SeedsRequest:
    """The pilot: an experiment `spec` (a spec file with its command-line `overrides`, or the
    experiment folder its `run` recorded the spec in), a results CSV `results`, or `sd` with
    `factors`; the effect size to detect, the power wanted, and the report's confidence and
    adjustment. `effect` and `sd` are in pp for an accuracy metric (`units`)."""

    effect: float
    spec: Path | None = None
    results: Path | None = None
    sd: float | list[float] | None = None
    """One sd, or (a transfer study) one per setting in the settings' order."""
    metric: str | None = None
    factors: list[str] | None = None
    power: float = 0.8
    confidence: float = 0.95
    adjust: str = "holm"
    overrides: list[str] | None = None
    settings: list[str] | None = None
    """--settings: the settings of a transfer study planned from --sd (a spec or pilot names its own)."""
    margin: float | None = None
    """--equivalence-margin of the report (pp for an accuracy metric); None: the report's default."""
    seeds: list[int] | None = None
    """--seeds: a transfer study's seeds per cell (one for every setting, or one per setting): what they buy."""

    @property
    def sds(self) -> list[float] | None:
        return None if self.sd is None else [self.sd] if isinstance(self.sd, (int, float)) else list(self.sd)


@dataclass(frozen=True)
class SeedPlan:
    table: pd.DataFrame
    metric: str
    sd: float
    source: str
    """Where the sd came from: the pilot's seeds, or --sd."""


@dataclass(frozen=True)
class SettingNoise:
    """A setting of a transfer plan and its run noise sd (the metric's stored units), with where it came from."""

    name: str
    sd: float
    source: str


@dataclass(frozen=True)
class TransferSeedPlan:
    """A transfer study's plan (``transfer_power.PLAN_COLUMNS``) and, when --seeds was given, what
    they buy (``transfer_power.BUDGET_COLUMNS``); sizes in the metric's stored units."""

    table: pd.DataFrame
    budget: pd.DataFrame | None
    metric: str
    settings: list[SettingNoise]
    effect: float
    margin: float
    seeds: list[int] | None


def plan_seeds(request: SeedsRequest) -> SeedPlan | TransferSeedPlan:
    """`effect` and `sd` are typed in pp for an accuracy metric (`units`); the plan's sd comes back
    in the metric's stored units. Two or more settings: a ``TransferSeedPlan``."""
    with user_errors(ReportInputError, SpecError, ConfigError):
        pilot = _pilot(request)
        if not pilot.factors:
            raise UserError("no factors: pass --factors a,b,... with --sd")
        effect = metric_units("--effect", request.effect, pilot.metric)
        if len(pilot.settings) >= 2:
            return _transfer_plan(request, pilot, effect)
        _one_setting_only(request)
        if request.sd is not None:
            sd, source = metric_units("--sd", request.sds[0], pilot.metric), "--sd"
        else:
            sd, source = pilot_sigma(pilot.results, pilot.factors, pilot.metric)
        table = seeds_table(pilot.factors, sd, effect, request.power, 1 - request.confidence, request.adjust)
    return SeedPlan(table, pilot.metric, sd, source)


def _one_setting_only(request: SeedsRequest) -> None:
    """One sentence for a transfer option given to a plan of one setting."""
    where = "give --settings a,b with --sd, or a spec or pilot with settings"
    if request.sds is not None and len(request.sds) > 1:
        raise UserError(f"--sd gives {len(request.sds)} values, and this plan has one setting; give one sd, or {where}")
    for flag, value in (("--seeds", request.seeds), ("--equivalence-margin", request.margin)):
        if value is not None:
            raise UserError(f"{flag} sizes a transfer study of two or more settings, and this plan has one; {where}")


@dataclass(frozen=True)
class Pilot:
    """What a plan starts from: the factors, the metric, the settings (empty: one) and the pilot's
    results (None without a pilot)."""

    factors: list[str] | None
    metric: str
    settings: list[str]
    results: pd.DataFrame | None


def _pilot(request: SeedsRequest) -> Pilot:
    metric = request.metric or DEFAULT_METRIC
    if request.results is not None:
        results, names = load_results_csv(request.results, request.factors, metric)
        return Pilot(names, metric, _named_settings(request, _result_settings(results), "the pilot CSV"), results)
    if request.spec is None:
        return Pilot(request.factors, metric, list(request.settings or []), None)
    experiment = load_experiment(request.spec, request.overrides)
    spec = experiment.spec
    metric = request.metric or spec.metric
    settings = _named_settings(request, [setting.name for setting in spec.settings], "the spec")
    try:
        results, factors, *_ = load_experiment_results(spec)
        return Pilot(factors, metric, settings, results)
    except (ResultsError, LedgerError) as error:
        if request.sd is None:
            raise UserError(f"{error}; without pilot results, pass --sd (the run-to-run sd of {metric})") from None
        return Pilot([factor.name for factor in experiment.plan.factors], metric, settings, None)


def _result_settings(results: pd.DataFrame) -> list[str]:
    if SETTING_COLUMN not in results.columns:
        return []
    return list(dict.fromkeys(results[SETTING_COLUMN].astype(str)))


def _named_settings(request: SeedsRequest, found: list[str], where: str) -> list[str]:
    """The settings ``where`` names; --settings may only repeat them."""
    if request.settings and request.settings != found:
        names = ", ".join(found) if found else "none"
        raise UserError(f"--settings {','.join(request.settings)} differs from the settings {where} names ({names}); "
                        "drop --settings (it names the settings of a plan from --sd alone)")
    return found


def _transfer_plan(request: SeedsRequest, pilot: Pilot, effect: float) -> TransferSeedPlan:
    """Seeds per cell for the report's "transfers" (equal effects within the margin) and "differs"
    (``effect`` apart) from each setting's own noise, and what --seeds buy."""
    seeds = _budget_seeds(request.seeds, pilot.settings)
    noise = _setting_noise(request, pilot)
    typed = DEFAULT_MARGIN_PP if request.margin is None else request.margin
    margin = metric_units("--equivalence-margin", typed, pilot.metric)
    alpha = 1 - request.confidence
    question = transfer_power.Question(effect, margin, request.power, alpha, request.adjust)
    sigmas = [setting.sd for setting in noise]
    table = transfer_power.plan_transfer(pilot.factors, sigmas, question)
    budget = None
    if seeds is not None:
        budget = transfer_power.budget_table(pilot.factors, sigmas, seeds, request.power, alpha, request.adjust)
    return TransferSeedPlan(table, budget, pilot.metric, noise, effect, margin, seeds)


def _setting_noise(request: SeedsRequest, pilot: Pilot) -> list[SettingNoise]:
    """Each setting's run noise sd: --sd (one for all, or one each), else its own pilot runs'."""
    names = pilot.settings
    order = f"one for every setting, or one per setting in the order {', '.join(names)}"
    if request.sds is not None:
        if len(request.sds) not in (1, len(names)):
            raise UserError(f"--sd gives {len(request.sds)} values for {len(names)} settings; give {order}")
        values = request.sds * len(names) if len(request.sds) == 1 else request.sds
        return [SettingNoise(name, metric_units("--sd", value, pilot.metric), "--sd") for name, value in zip(names, values)]
    noise = []
    for name in names:
        rows = None if pilot.results is None else pilot.results[pilot.results[SETTING_COLUMN].astype(str) == name]
        if rows is None or rows.empty:
            raise UserError(f"setting '{name}' has no finished runs to take its noise from; pass --sd ({order})")
        try:
            sd, source = pilot_sigma(rows.drop(columns=SETTING_COLUMN), pilot.factors, pilot.metric)
        except ReportInputError as error:
            raise UserError(f"setting '{name}': {error}") from None
        noise.append(SettingNoise(name, sd, source))
    return noise


def _budget_seeds(seeds: list[int] | None, names: list[str]) -> list[int] | None:
    """--seeds for every setting, checked: 2..MAX_SEEDS each, one count or one per setting."""
    if seeds is None:
        return None
    if len(seeds) not in (1, len(names)):
        raise UserError(f"--seeds gives {len(seeds)} counts for {len(names)} settings; give one for every setting, "
                        f"or one per setting in the order {', '.join(names)}")
    for count in seeds:
        if not transfer_power.MIN_SEEDS <= count <= MAX_SEEDS:
            raise UserError(f"--seeds {count} is outside {transfer_power.MIN_SEEDS}..{MAX_SEEDS}: a setting's own noise "
                            f"needs at least {transfer_power.MIN_SEEDS} seeds per cell; give a count from "
                            f"{transfer_power.MIN_SEEDS} to {MAX_SEEDS}")
    return list(seeds) * len(names) if len(seeds) == 1 else list(seeds)


def transfer_display(plan: TransferSeedPlan) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The plan's tables as plan-seeds prints them: sizes in pp for an accuracy metric (the
    column names say so), the by-noise columns only where the settings' noise differs."""
    pp = is_accuracy(plan.metric)
    unit = " (pp)" if pp else ""
    scale = 100.0 if pp else 1.0
    table = plan.table.copy()
    table["size"] = table["size"] * scale
    table = table.rename(columns={"size": "size" + unit})
    if len({setting.sd for setting in plan.settings}) == 1:
        table = table.drop(columns=["by_noise", "by_noise_runs", "by_noise_power"])
    budget = None
    if plan.budget is not None:
        budget = plan.budget.copy()
        for column in ("transfers_margin", "detectable_difference"):
            budget[column] = budget[column] * scale
        budget = budget.rename(columns={c: c + unit for c in ("transfers_margin", "detectable_difference")})
    return table, budget
