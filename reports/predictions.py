"""Predictions as artifacts: every report writes ``predictions.yaml``, what its experiment predicts
for another; a later report given that file (``--predictions FILE``, or a spec's ``confirm:``)
says term by term whether its own data confirm it (``verdicts.direction_verdict``), and how well
the effects' ranks agree across the two experiments.

predictions.yaml (values in the metric's units, as the CSVs store them)::

    format: dapo-ablate predictions 1
    metric: avg@32
    confidence: 0.95               # of every interval below
    predictions:
      - statistic: main            # main | shapley | interaction
        term: clip_higher
        direction: positive        # positive | negative | zero: the interval's side of zero (zero: it holds zero)
        estimate: 0.052
        ci_low: 0.011
        ci_high: 0.093
        se: 0.018
        df: 9.0
        from_setting: {name: base, model_family: qwen2.5, model_size: 7B, model_type: base,
                       task: dapo-math-17k, max_response_len: 20480}
        for_setting: {}            # attributes of the setting it is predicted for; {}: any

A prediction is confirmed in every setting of the later experiment; ``matches_setting`` says
whether that setting is the one it was predicted for. Rank agreement: Kendall's tau-b between the
predicted and the new main effects (Shapley values where the file has no main effects), with a
percentile interval from a bootstrap that resamples the new experiment's seeds (a seed's runs in
every cell together) and draws each predicted value from its normal sampling distribution (the file
keeps estimates and SEs, not runs); with one seed per cell the new values are drawn the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from dapo_ablate.core.contracts import SEED_COLUMN, SETTING_ATTRIBUTES, SettingInfo

from .analysis import Analysis
from .claims import amount, interval, short_term
from .table import ReportInputError
from .transfer import TermValues, term_values
from .verdicts import DIRECTIONS, NEGATIVE, NULL, POSITIVE, direction_of, direction_verdict, equivalence_interval, setting_matches

FORMAT = "dapo-ablate predictions 1"
STATISTICS = ("main", "shapley", "interaction")
STATISTIC_LABELS = {"main": "main effect", "shapley": "Shapley value", "interaction": "interaction"}
CONFIRMATION_COLUMNS = [
    "statistic", "term", "from_setting", "setting", "matches_setting", "direction", "predicted_estimate",
    "predicted_ci_low", "predicted_ci_high", "estimate", "ci_low", "ci_high", "equivalence_low", "equivalence_high",
    "margin", "verdict",
]  # fmt: skip
RANK_COLUMNS = ["setting", "statistic", "n_terms", "kendall_tau", "ci_low", "ci_high", "method", "draws"]
DRAWS = 2000
"""Bootstrap draws behind the rank agreement's interval (seeded: the same report twice agrees)."""
_PREDICTION_KEYS = ("statistic", "term", "direction", "estimate", "ci_low", "ci_high", "se", "df")


@dataclass(frozen=True)
class Prediction:
    statistic: str
    term: str
    direction: str
    estimate: float
    ci_low: float
    ci_high: float
    se: float
    df: float
    from_setting: dict[str, Any]
    for_setting: dict[str, Any]


# --------------------------------------------------------------------------------------- writing
def _rows_of(values: TermValues, index: int, source: SettingInfo, target: SettingInfo | None) -> dict[str, Any] | None:
    low, high = float(values.ci_low[index]), float(values.ci_high[index])
    if not (np.isfinite(low) and np.isfinite(high)):
        return None  # no interval, no prediction
    target_attributes = {} if target is None else {k: v for k, v in target.attributes().items() if v is not None}
    return {
        "statistic": values.statistic, "term": values.term, "direction": direction_of(low, high),
        "estimate": float(values.estimate[index]), "ci_low": low, "ci_high": high, "se": float(values.se[index]),
        "df": float(values.df[index]), "from_setting": {"name": source.name, **source.attributes()},
        "for_setting": target_attributes,
    }  # fmt: skip


def predictions_data(analyses: dict[str, Analysis], infos: dict[str, SettingInfo], target: SettingInfo | None) -> dict:
    """predictions.yaml's content: every setting's main effects, Shapley values and two-factor
    interactions that have an interval (module docstring)."""
    first = next(iter(analyses.values()))
    rows = []
    for name, analysis in analyses.items():
        source = infos.get(name) or SettingInfo(name)
        for values in term_values([analysis]):
            row = _rows_of(values, 0, source, target)
            if row is not None:
                rows.append(row)
    return {"format": FORMAT, "metric": first.metric, "confidence": first.confidence, "predictions": rows}


def write_predictions(path: Path, data: dict) -> Path:
    header = "# What this experiment predicts for another (dapo-ablate report; confirm with `report --predictions`).\n"
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------- reading
def _prediction(entry: Any, i: int, where: str) -> Prediction:
    if not isinstance(entry, dict) or any(key not in entry for key in _PREDICTION_KEYS):
        raise ReportInputError(f"{where}: predictions[{i}] needs {', '.join(_PREDICTION_KEYS)}; write the file with "
                               "`dapo-ablate report`")
    if entry["statistic"] not in STATISTICS or str(entry["direction"]) not in DIRECTIONS:
        raise ReportInputError(f"{where}: predictions[{i}] has statistic {entry['statistic']!r} and direction "
                               f"{entry['direction']!r}; use one of {', '.join(STATISTICS)} and one of {', '.join(DIRECTIONS)}")
    try:
        numbers = [float(entry[key]) for key in ("estimate", "ci_low", "ci_high", "se", "df")]
    except (TypeError, ValueError):
        raise ReportInputError(f"{where}: predictions[{i}] has a value that is not a number; give numbers") from None
    settings = [entry.get(key) or {} for key in ("from_setting", "for_setting")]
    if not all(isinstance(s, dict) and set(s) <= {"name", *SETTING_ATTRIBUTES} for s in settings):
        raise ReportInputError(f"{where}: predictions[{i}]'s settings must map name and {', '.join(SETTING_ATTRIBUTES)}")
    return Prediction(entry["statistic"], str(entry["term"]), str(entry["direction"]), *numbers, *settings)


def load_predictions(path: str | Path, metric: str, where: str | None = None) -> list[Prediction]:
    """The predictions of a predictions.yaml; ReportInputError (one sentence, naming ``where``: the
    option or spec field that gave it) for a file that is not one, or that predicts another metric."""
    where = where or f"--predictions {str(path)!r}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ReportInputError(f"{where}: cannot read it ({error.strerror or error}); give the predictions.yaml a report wrote") from None
    except yaml.YAMLError:
        raise ReportInputError(f"{where} is not YAML; give the predictions.yaml a report wrote") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("predictions"), list):
        raise ReportInputError(f"{where} is not a predictions file ({FORMAT!r}); give the predictions.yaml a report wrote")
    if data.get("metric") != metric:
        raise ReportInputError(f"{where} predicts {data.get('metric')!r}, this report analyses {metric!r}; "
                               f"report --metric {data.get('metric')} or give predictions of {metric}")
    return [_prediction(entry, i, where) for i, entry in enumerate(data["predictions"])]


# ---------------------------------------------------------------------------------- confirming
@dataclass
class Confirmation:
    """The verdict on every prediction in every setting of this experiment, and the rank agreement
    (one computation: report.md / report.html, the console and confirmation.csv render it)."""

    table: pd.DataFrame  # CONFIRMATION_COLUMNS
    ranks: pd.DataFrame  # RANK_COLUMNS with from_setting
    percent: bool
    alpha: float

    def lines(self) -> list[str]:
        return confirmation_lines(self)


def _verdict_row(p: Prediction, values: TermValues | None, setting: SettingInfo, margin: float, alpha: float) -> dict:
    nan = float("nan")
    est, low, high, se, df = (nan,) * 5 if values is None else (
        float(values.estimate[0]), float(values.ci_low[0]), float(values.ci_high[0]), float(values.se[0]), float(values.df[0]))
    equivalent = equivalence_interval(est, se, df, alpha)
    return {
        "statistic": p.statistic, "term": p.term, "from_setting": p.from_setting.get("name", ""), "setting": setting.name,
        "matches_setting": setting_matches(p.for_setting, setting), "direction": p.direction,
        "predicted_estimate": p.estimate, "predicted_ci_low": p.ci_low, "predicted_ci_high": p.ci_high, "estimate": est,
        "ci_low": low, "ci_high": high, "equivalence_low": equivalent[0] if p.direction == NULL else nan,
        "equivalence_high": equivalent[1] if p.direction == NULL else nan, "margin": margin,
        "verdict": direction_verdict(p.direction, low, high, equivalent, margin),
    }  # fmt: skip


def confirm_predictions(
    predictions: list[Prediction], analyses: dict[str, Analysis], infos: dict[str, SettingInfo],
    runs: dict[str, pd.DataFrame], margin: float, seed: int = 0,
) -> Confirmation:
    """Every prediction judged in every setting (``analyses``, its ``runs``: the setting's results
    rows), and the rank agreement per (predicting setting, setting)."""
    first = next(iter(analyses.values()))
    alpha = 1 - first.confidence
    rows, ranks = [], []
    for name, analysis in analyses.items():
        found = {(v.statistic, v.term): v for v in term_values([analysis])}
        setting = infos.get(name) or SettingInfo(name)
        rows += [_verdict_row(p, found.get((p.statistic, p.term)), setting, margin, alpha) for p in predictions]
        for source in dict.fromkeys(p.from_setting.get("name", "") for p in predictions):
            chosen = [p for p in predictions if p.from_setting.get("name", "") == source]
            ranks.append({"from_setting": source, "setting": name,
                          **rank_agreement(chosen, found, runs.get(name), analysis, seed)})  # fmt: skip
    return Confirmation(pd.DataFrame(rows, columns=CONFIRMATION_COLUMNS),
                        pd.DataFrame(ranks, columns=["from_setting", *RANK_COLUMNS]), first.percent, alpha)


def kendall_tau(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b between the rows of ``x`` and ``y`` ([draws, T] each; or [T])."""
    i, j = np.triu_indices(x.shape[-1], 1)
    sx, sy = np.sign(x[..., j] - x[..., i]), np.sign(y[..., j] - y[..., i])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sx * sy).sum(-1) / np.sqrt((sx**2).sum(-1) * (sy**2).sum(-1))


def _t_draws(estimate: np.ndarray, se: np.ndarray, df: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[DRAWS, T]: each value drawn from its sampling distribution (estimate + se x t_df)."""
    return estimate + se * rng.standard_t(np.maximum(df, 1.0), size=(DRAWS, len(estimate)))


def seed_bootstrap_main(runs: pd.DataFrame, factors: list[str], metric: str, rng: np.random.Generator) -> np.ndarray | None:
    """[DRAWS, len(factors)]: each factor's main effect (cell means with it on minus off) over the
    seeds resampled with replacement (a seed's runs in every cell together); None under two seeds."""
    seeds = runs[SEED_COLUMN].unique()
    if len(seeds) < 2:
        return None
    table = runs.groupby([*factors, SEED_COLUMN])[metric].mean().unstack(SEED_COLUMN).reindex(columns=seeds)
    values, present = np.nan_to_num(table.to_numpy(float)), table.notna().to_numpy(float)  # [C, S]
    counts = rng.multinomial(len(seeds), np.full(len(seeds), 1 / len(seeds)), size=DRAWS)  # [DRAWS, S]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (counts @ values.T) / (counts @ present.T)  # [DRAWS, C]: each cell's mean over the drawn seeds
    levels = table.index.to_frame(index=False)[factors].to_numpy(int)  # [C, k]
    on = np.stack([np.nanmean(np.where(levels[:, f] == 1, means, np.nan), axis=1) for f in range(len(factors))], 1)
    off = np.stack([np.nanmean(np.where(levels[:, f] == 0, means, np.nan), axis=1) for f in range(len(factors))], 1)
    return on - off


def rank_agreement(chosen: list[Prediction], found: dict, runs: pd.DataFrame | None, analysis: Analysis, seed: int) -> dict:
    """Kendall's tau between predicted and new values of one statistic (main effects, else
    Shapley values), with its percentile interval (module docstring)."""
    statistic = "main" if any(p.statistic == "main" for p in chosen) else "shapley"
    pairs = [(p, found[(p.statistic, p.term)]) for p in chosen if p.statistic == statistic and (p.statistic, p.term) in found]
    pairs = [(p, v) for p, v in pairs if np.isfinite(v.estimate[0]) and np.isfinite(v.se[0])]
    empty = {"statistic": statistic, "n_terms": len(pairs), "kendall_tau": np.nan, "ci_low": np.nan, "ci_high": np.nan,
             "method": "fewer than 3 terms in both", "draws": 0}  # fmt: skip
    if len(pairs) < 3:
        return empty
    rng = np.random.default_rng(seed)
    old = np.array([[p.estimate, p.se, p.df] for p, _ in pairs])
    new = np.array([[v.estimate[0], v.se[0], v.df[0]] for _, v in pairs])
    terms = [p.term for p, _ in pairs]
    boot = None
    if statistic == "main" and runs is not None and set(terms) <= set(analysis.factors):
        boot = seed_bootstrap_main(runs, terms, analysis.metric, rng)
    method = "seeds resampled; predicted values drawn from their t distributions" if boot is not None else (
        "both sides' values drawn from their t distributions (fewer than two seeds)")
    if boot is None:
        boot = _t_draws(new[:, 0], new[:, 1], new[:, 2], rng)
    taus = kendall_tau(_t_draws(old[:, 0], old[:, 1], old[:, 2], rng), boot)
    alpha = 1 - analysis.confidence
    low, high = np.nanquantile(taus, [alpha / 2, 1 - alpha / 2])
    return {**empty, "kendall_tau": float(kendall_tau(old[:, 0], new[:, 0])), "ci_low": float(low), "ci_high": float(high),
            "method": method, "draws": DRAWS}


# ------------------------------------------------------------------------------------ rendering
def _line(row: Any, percent: bool) -> str:
    said = {POSITIVE: "helps", NEGATIVE: "hurts", NULL: "has no effect (within the margin)"}[row.direction]
    new = "no estimate here" if not np.isfinite(row.estimate) else (
        f"here {amount(row.estimate, percent)} {interval(row.ci_low, row.ci_high, percent)}")
    if row.direction == NULL and np.isfinite(row.equivalence_low):
        new += f", {interval(row.equivalence_low, row.equivalence_high, percent)} against +-{amount(row.margin, percent)[1:]}"
    where = "" if row.matches_setting else " (not the setting it was predicted for)"
    return (f"In {row.setting}: {short_term(row.term)} ({STATISTIC_LABELS[row.statistic]}) {said}, predicted from "
            f"{row.from_setting or 'another experiment'} at {amount(row.predicted_estimate, percent)} "
            f"{interval(row.predicted_ci_low, row.predicted_ci_high, percent)}; {new}{where}: {row.verdict}.")


def confirmation_lines(confirmation: Confirmation) -> list[str]:
    """One sentence per row of confirmation.csv, one per rank agreement, then how they were read."""
    lines = [_line(row, confirmation.percent) for row in confirmation.table.itertuples(index=False)]
    for r in confirmation.ranks.itertuples(index=False):
        tau = "not computed" if not np.isfinite(r.kendall_tau) else (
            f"Kendall's tau {r.kendall_tau:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}] ({r.method})")
        lines.append(f"Rank agreement of the {r.n_terms} {STATISTIC_LABELS[r.statistic]}s, {r.from_setting or 'predicted'} "
                     f"vs {r.setting}: {tau}.")
    lines.append(
        f"Each verdict is per term at {confidence_text(confirmation.alpha)}: confirmed = the interval excludes zero on the "
        "predicted side (for a predicted null: the (1 - 2 alpha) interval lies within the margin); contradicted = it "
        f"excludes zero on the other side; a term with no effect reads confirmed or contradicted with probability at most "
        f"{confirmation.alpha / 2:.1%} each, with no adjustment over the {len(confirmation.table)} verdicts.")
    return lines


def confidence_text(alpha: float) -> str:
    return f"the report's {1 - alpha:.0%} intervals"
