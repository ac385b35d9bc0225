"""Published technique effects beside the experiment's own: ``data/published_effects.yaml`` lists
the direction each source reports for a technique, the setting it was measured in and the
citation; a report sets its estimate beside every entry whose setting matches one of its settings
(``verdicts.setting_matches``) and says agree / disagree / inconclusive by the rule predictions are
confirmed with (``verdicts.direction_verdict``: agree = confirmed, disagree = contradicted).

What is compared: an entry of estimand ``final`` with the technique's main effect on the report's
metric; ``asymptote`` with its effect on the compute curve's asymptote (compute_curves.csv; no
equivalence interval there, so a published ``0`` reads inconclusive). The sources measured other
contrasts (a cumulative step, one technique added to a baseline), other metrics and one run per
configuration, so a disagreement says the direction did not carry over to this design, not that a
source is wrong.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from dapo_ablate.core.contracts import SETTING_ATTRIBUTES, TECHNIQUE_LABELS, TECHNIQUES, SettingInfo

from .analysis import Analysis
from .claims import amount, interval
from .transfer import term_values
from .verdicts import (
    CONFIRMED, CONTRADICTED, DIRECTIONS, INCONCLUSIVE, NEGATIVE, NO_DATA, NULL, POSITIVE, direction_verdict, equivalence_interval,
    setting_matches,
)

DATA = Path(__file__).parent / "data" / "published_effects.yaml"
FORMAT = "dapo-ablate published effects 1"
ESTIMANDS = ("final", "asymptote")
AGREEMENT = {CONFIRMED: "agree", CONTRADICTED: "disagree", INCONCLUSIVE: "inconclusive", NO_DATA: "not enough data"}
PUBLISHED_COLUMNS = [
    "setting", "technique", "direction", "estimand", "source", "citation", "design", "published_setting", "metric",
    "estimate", "ci_low", "ci_high", "equivalence_low", "equivalence_high", "margin", "verdict",
]  # fmt: skip
_KEYS = ("technique", "direction", "estimand", "design", "setting", "metric", "source", "citation")


def _checked(entry: Any, i: int) -> dict[str, Any]:
    """One entry of the data file, checked (a broken file is a bug of this package: ValueError)."""
    if not isinstance(entry, dict) or set(entry) != set(_KEYS):
        raise ValueError(f"{DATA.name}: effects[{i}] must have exactly {', '.join(_KEYS)}")
    if entry["technique"] not in TECHNIQUES or entry["direction"] not in DIRECTIONS or entry["estimand"] not in ESTIMANDS:
        raise ValueError(f"{DATA.name}: effects[{i}] has an unknown technique, direction or estimand")
    if not set(entry["setting"]) <= set(SETTING_ATTRIBUTES):
        raise ValueError(f"{DATA.name}: effects[{i}]'s setting names attributes other than {', '.join(SETTING_ATTRIBUTES)}")
    return entry


@lru_cache(maxsize=1)
def published_effects() -> tuple[dict[str, Any], ...]:
    """The entries of data/published_effects.yaml (module docstring)."""
    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise ValueError(f"{DATA.name} is not {FORMAT!r}")
    return tuple(_checked(entry, i) for i, entry in enumerate(data["effects"]))


def describe_setting(stated: dict[str, Any]) -> str:
    """``model_size 4B or 8B, model_type instruct``: a published setting in words."""
    shown = lambda v: " or ".join(map(str, v)) if isinstance(v, list) else str(v)  # noqa: E731
    return ", ".join(f"{name} {shown(stated[name])}" for name in SETTING_ATTRIBUTES if name in stated)


def _own_value(entry: dict, analysis: Analysis) -> tuple[float, float, float, tuple[float, float]]:
    """(estimate, ci_low, ci_high, equivalence interval) the entry is compared with (NaN: none)."""
    nan = float("nan")
    if entry["estimand"] == "asymptote":
        curves = analysis.compute_curves
        row = curves[curves["term"] == entry["technique"]] if "term" in curves else curves
        if not len(row):
            return nan, nan, nan, (nan, nan)
        r = row.iloc[0]
        return float(r["asymptote_effect"]), float(r["asymptote_ci_low"]), float(r["asymptote_ci_high"]), (nan, nan)
    found = {v.term: v for v in term_values([analysis]) if v.statistic == "main"}.get(entry["technique"])
    if found is None:
        return nan, nan, nan, (nan, nan)
    est, se, df = float(found.estimate[0]), float(found.se[0]), float(found.df[0])
    return est, float(found.ci_low[0]), float(found.ci_high[0]), equivalence_interval(est, se, df, 1 - analysis.confidence)


def published_comparison(analyses: dict[str, Analysis], infos: dict[str, SettingInfo], margin: float) -> pd.DataFrame:
    """published.csv: one row per (setting, matching entry) whose technique is a factor here."""
    rows = []
    for name, analysis in analyses.items():
        info = infos.get(name) or SettingInfo(name)
        for entry in published_effects():
            if entry["technique"] not in analysis.factors or not setting_matches(entry["setting"], info):
                continue
            est, low, high, equivalent = _own_value(entry, analysis)
            verdict = direction_verdict(entry["direction"], low, high, equivalent, margin)
            rows.append({
                "setting": name, **{key: entry[key] for key in ("technique", "direction", "estimand", "source", "citation",
                                                                "design")},
                "published_setting": describe_setting(entry["setting"]), "metric": entry["metric"], "estimate": est,
                "ci_low": low, "ci_high": high, "equivalence_low": equivalent[0] if entry["direction"] == NULL else np.nan,
                "equivalence_high": equivalent[1] if entry["direction"] == NULL else np.nan, "margin": margin,
                "verdict": AGREEMENT[verdict],
            })  # fmt: skip
    return pd.DataFrame(rows, columns=PUBLISHED_COLUMNS)


def published_lines(table: pd.DataFrame, infos: dict[str, SettingInfo], percent: bool) -> list[str]:
    """One sentence per row of published.csv; one saying so when no published setting matches."""
    said = {POSITIVE: "helps", NEGATIVE: "hurts", NULL: "has little or no effect"}
    lines = []
    for r in table.itertuples(index=False):
        what = "effect on the asymptote" if r.estimand == "asymptote" else "main effect"
        own = "no estimate here" if not np.isfinite(r.estimate) else (
            f"here its {what} is {amount(r.estimate, percent)} {interval(r.ci_low, r.ci_high, percent)}")
        lines.append(f"In {r.setting}: {r.source} reports that {TECHNIQUE_LABELS[r.technique]} {said[r.direction]} "
                     f"({r.design}; {r.published_setting}; {r.metric}; {r.citation}); {own}: {r.verdict}.")
    if table.empty:
        described = "; ".join(f"{info.name}: {info.describe()}" for info in infos.values())
        lines.append(f"No published direction in the package's list ({len(published_effects())} entries) matches this "
                     f"experiment's settings ({described}); give a setting's model and task in the spec's attributes section.")
    else:
        lines.append("Agree / disagree: the interval excludes zero on the published side / the other side (a published "
                     "'little or no effect' (zero): the (1 - 2 alpha) interval lies within the margin); the sources measured "
                     "other contrasts and metrics with one run each, so these compare directions, not sizes.")
    return lines
