"""The looks of an adaptive experiment, as its report shows them: `looks.csv` (one row per look and
term: the repeated confidence interval that holds over all looks, and the decision) and `looks.md`
(one line per look: runs so far, decisions, alpha spent, what followed; then the runs saved
against the fixed design of the same power).

The input is the looks as the ledger records them (`reports.sequential.Look.to_dict()` with the
scheduler's `added`, `stopped`, `action`, `reason`, `runs_saved`): plain data, so this module
imports nothing of the scheduler. For an adaptive experiment these decisions are its claims: the
report's other intervals are fixed-design ones, which do not account for the looks.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from .export import write_csv

LOOK_TABLE_COLUMNS = ["look", "runs", "alpha_spent", "term", "estimate", "ci_low", "ci_high", "decision", "unit"]
"""looks.csv: estimate and interval in the metric's units (fractions: ``unit`` says so)."""
DECISIONS = ("supported", "not supported", "undecided")
NOT_WATCHED = "not watched"
"""Confirm mode: a term the looks estimate but do not decide (``sequential.NOT_WATCHED``)."""


def looks_table(looks: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (look, term) in look order (LOOK_TABLE_COLUMNS)."""
    rows = [
        {"look": int(look.get("number", look.get("look", 0))), "runs": look.get("runs"), "alpha_spent": look.get("spent"),
         "term": row.get("term"), "estimate": row.get("estimate"), "ci_low": row.get("ci_low"),
         "ci_high": row.get("ci_high"), "decision": row.get("decision"), "unit": "fraction"}
        for look in looks for row in look.get("terms", [])
    ]
    return pd.DataFrame(rows, columns=LOOK_TABLE_COLUMNS)


def look_sentences(looks: Sequence[Mapping[str, Any]], alpha: float | None = None) -> list[str]:
    """One line per look, then the final decisions in pp and the runs saved."""
    lines = []
    for look in looks:
        counts = Counter(str(row.get("decision")) for row in look.get("terms", []))
        decided = ", ".join(f"{counts.get(d, 0)} {d}" for d in DECISIONS) + (
            f", {counts[NOT_WATCHED]} not watched" if counts.get(NOT_WATCHED) else "")
        then = (f"stopped: {look.get('reason')}" if look.get("stopped")
                else f"then {str(look.get('action', '')).replace('_', ' ')}, {len(look.get('added', []))} runs added")
        spent = f"alpha spent {float(look.get('spent', 0)):.4f}" + (f" of {alpha:g}" if alpha is not None else "")
        lines.append(f"Look {look.get('number', look.get('look'))}: {look.get('runs')} runs; {decided}; {spent}; {then}.")
    if looks:
        last = looks[-1]
        for row in last.get("terms", []):
            if row.get("decision") == NOT_WATCHED:  # confirm mode: estimated, never decided
                lines.append(f"{row.get('term')}: {_pp(row.get('estimate'))} pp, not watched (confirm mode decides only "
                             "the predicted terms).")
                continue
            lines.append(f"{row.get('term')}: {_pp(row.get('estimate'))} pp [{_pp(row.get('ci_low'))}, "
                         f"{_pp(row.get('ci_high'))}] (repeated CI over all looks), {row.get('decision')}.")
        if last.get("runs_saved"):
            lines.append(f"Runs: {last['runs_saved']}")
    return lines


def write_looks(looks: Sequence[Mapping[str, Any]], out_dir: str | Path, alpha: float | None = None) -> dict[str, Path]:
    """looks.csv and looks.md into `out_dir`; nothing without looks."""
    if not looks:
        return {}
    out = Path(out_dir)
    written = {"looks.csv": out / "looks.csv", "looks.md": out / "looks.md"}
    write_csv(looks_table(looks), written["looks.csv"])
    text = ["# Looks of the adaptive design", "",
            "Each look decided every term from the runs so far; the intervals are repeated confidence intervals, "
            "valid over all looks together (the report's other intervals are fixed-design ones and do not account "
            "for the looks). Estimates in pp of the metric; looks.csv holds them as fractions.", ""]
    text += [f"- {line}" for line in look_sentences(looks, alpha)]
    written["looks.md"].write_text("\n".join(text) + "\n", encoding="utf-8")
    return written


def _pp(value: Any) -> str:
    try:
        return f"{100 * float(value):+.1f}"
    except (TypeError, ValueError):
        return "n/a"
