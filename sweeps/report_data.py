"""A sweep report's tables (what `sweeps.report.build_report` computes and `sweeps.plots` draws)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


@dataclass
class SweepReport:
    name: str
    metric: str
    direction: str
    knobs: list[str]
    factors: list[str]
    best_params: pd.DataFrame
    trials: pd.DataFrame
    importances: pd.DataFrame
    importance_note: str = ""
    effects: pd.DataFrame | None = None
    effect_summary: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)
