"""Confirm mode of an adaptive design: the verdict on each prediction it watched, read from its looks.

An adaptive experiment whose spec has ``confirm:`` watches only the predicted terms
(``sequential.SequentialSettings.watch``): its looks decide them alone and it stops once they are
decided. Each look record then carries ``confirm`` (written by the look policy)::

    confirm:
      predictions: /path/predictions.yaml
      margin: 0.02                     # the effect of interest, in the metric's units
      setting: large                   # this experiment's setting
      predicted:                       # the watched predictions, one per term
        - {statistic: main, term: soft_overlong, direction: negative, estimate: -0.06, ci_low: -0.09,
           ci_high: -0.03, from_setting: small, matches_setting: true}

The verdict on each (``verdicts.direction_verdict``, the rule of every confirmation) reads the
term's repeated confidence interval at the look that decided it (the last look when none did): a
supported term on the predicted side is confirmed, on the other side contradicted; a predicted
zero is confirmed when the interval lies within +-margin (the look's futility decision); anything
else is inconclusive. Computed from the looks alone, so the console after ``run``, ``status``, the
report (confirmation.csv and its section) and the MLflow parent run say the same verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .claims import amount, interval, short_term
from .verdicts import NEGATIVE, NULL, POSITIVE, direction_verdict

LABELS = {"main": "main effect", "shapley": "Shapley value", "interaction": "interaction"}


def number_or_nan(value: Any) -> float:
    """A look record's stored number as a float; NaN where it holds none (null, text)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _deciding_row(looks: Sequence[Mapping[str, Any]], term: str) -> tuple[int, Mapping[str, Any]]:
    """(look number, the term's row) at the first look that decided it, else at the last look."""
    found: tuple[int, Mapping[str, Any]] = (0, {})
    for index, one in enumerate(looks, start=1):
        number = int(one.get("number", one.get("look", index)))
        row = next((r for r in one.get("terms", []) if str(r.get("term")) == term), None)
        if row is None:
            continue
        found = (number, row)
        if row.get("decision") in ("supported", "not supported"):  # sequential's SUPPORTED / NOT_SUPPORTED (importing them closes an import cycle)
            break
    return found


def look_verdicts(looks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """One row per watched prediction (confirmation.csv's columns, with ``look`` and ``decision``);
    None for an experiment not in confirm mode."""
    confirm = looks[-1].get("confirm") if looks else None
    if not confirm:
        return None
    margin = number_or_nan(confirm.get("margin"))
    rows = []
    for p in confirm.get("predicted", []):
        number, row = _deciding_row(looks, str(p["term"]))
        estimate, low, high = (number_or_nan(row.get(key)) for key in ("estimate", "ci_low", "ci_high"))
        rows.append({
            "statistic": p["statistic"], "term": p["term"], "from_setting": p.get("from_setting", ""),
            "setting": confirm.get("setting", ""), "matches_setting": bool(p.get("matches_setting", True)),
            "direction": p["direction"], "predicted_estimate": number_or_nan(p.get("estimate")),
            "predicted_ci_low": number_or_nan(p.get("ci_low")), "predicted_ci_high": number_or_nan(p.get("ci_high")),
            "estimate": estimate, "ci_low": low, "ci_high": high,
            "equivalence_low": low if p["direction"] == NULL else float("nan"),
            "equivalence_high": high if p["direction"] == NULL else float("nan"), "margin": margin,
            "verdict": direction_verdict(p["direction"], low, high, (low, high), margin),
            "look": number, "decision": row.get("decision", "not estimated"),
        })  # fmt: skip
    return rows


def look_verdict_lines(rows: list[dict[str, Any]], percent: bool, alpha: float | None) -> list[str]:
    """One sentence per watched prediction, then how the verdicts were reached."""
    said = {POSITIVE: "helps", NEGATIVE: "hurts", NULL: "has no effect (within the margin)"}
    lines = []
    for r in rows:
        here = "no estimate here" if not np.isfinite(r["ci_low"]) else (
            f"here {amount(r['estimate'], percent)} {interval(r['ci_low'], r['ci_high'], percent)} (repeated CI, "
            f"look {r['look']}: {r['decision']})")
        where = "" if r["matches_setting"] else " (not the setting it was predicted for)"
        lines.append(
            f"In {r['setting'] or 'this experiment'}: {short_term(r['term'])} ({LABELS.get(r['statistic'], r['statistic'])}) "
            f"{said[r['direction']]}, predicted from {r['from_setting'] or 'another experiment'} at "
            f"{amount(r['predicted_estimate'], percent)} {interval(r['predicted_ci_low'], r['predicted_ci_high'], percent)}; "
            f"{here}{where}: {r['verdict']}.")
    level = f"{alpha:g}" if alpha is not None else "alpha"
    margin = amount(rows[0]["margin"], percent)[1:] if rows else ""
    lines.append(
        f"Confirm mode: the looks watched only these {len(rows)} predicted term{'s' if len(rows) != 1 else ''} and "
        "stopped once they were decided; each verdict reads the term's repeated confidence interval at the look that "
        f"decided it (the last look if none did); a predicted zero is confirmed when that interval lies within "
        f"+-{margin}; the family-wise error over the watched terms and all looks is at most {level}.")
    return lines
