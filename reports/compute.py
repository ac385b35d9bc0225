"""Compute accounting per cell, and the equal-compute view.

Dynamic sampling can reach a score in fewer training steps while generating many more tokens
(it discards groups whose samples are all right or all wrong): fewer steps is not less compute.
So gains are also given per million tokens a cell *added* over the baseline, and, where the
results carry evaluation curves with cumulative token counts, every run's metric is read at one
common generated-token budget (interpolated between its evaluations, never extrapolated) and
the effects are estimated again at that budget.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dapo_ablate.core.contracts import COMPUTE_COLUMNS, SEED_COLUMN

from .table import cell_label, cell_masks

TOKENS = "tokens_generated"


def gain_per_added_mtok(gain: np.ndarray, tokens: np.ndarray, baseline_tokens: float) -> np.ndarray:
    """gain / ((tokens - baseline_tokens) / 1e6); NaN where a cell adds no tokens.

    Example: +0.08 over the baseline for 40M tokens against the baseline's 30M -> 0.08 / 10 =
    0.008 per added million tokens. A cell that generates no more than the baseline has no
    such ratio (NaN): its gain, if any, came at no extra generation.
    """
    added = (np.asarray(tokens, float) - float(baseline_tokens)) / 1e6
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(added > 0, np.asarray(gain, float) / added, np.nan)


def compute_table(results: pd.DataFrame, factors: list[str], metric: str, means: pd.Series) -> pd.DataFrame:
    """Per cell: runs, estimated mean (``means``, by cell bitmask), tokens generated (means over
    seeds, discarded included), tokens discarded, discarded share, wall seconds, tokens relative
    to the baseline, gain over the baseline and gain per million added tokens. Missing compute
    columns give NaN."""
    table = results.assign(_mask=cell_masks(results, factors))
    for column in COMPUTE_COLUMNS:
        if column not in table:
            table[column] = np.nan
    grouped = table.groupby("_mask")
    cells = grouped[list(COMPUTE_COLUMNS)].mean()
    cells["n"] = grouped.size()
    cells["mean"] = means.reindex(cells.index)
    baseline = cells.loc[0] if 0 in cells.index else pd.Series(np.nan, index=cells.columns)
    out = pd.DataFrame(
        {
            "cell": [cell_label(int(m), factors) for m in cells.index],
            **{f: [int(m) >> i & 1 for m in cells.index] for i, f in enumerate(factors)},
            "n": cells["n"].to_numpy(),
            "mean": cells["mean"].to_numpy(),
            TOKENS: cells[TOKENS].to_numpy(),
            "tokens_discarded": cells["tokens_discarded"].to_numpy(),
            "discarded_share": (cells["tokens_discarded"] / cells[TOKENS]).to_numpy(),
            "wall_s": cells["wall_s"].to_numpy(),
            "tokens_vs_baseline": (cells[TOKENS] / baseline[TOKENS]).to_numpy(),
            "gain": (cells["mean"] - baseline["mean"]).to_numpy(),
        },
        index=cells.index,
    )
    out["gain_per_added_mtok"] = gain_per_added_mtok(out["gain"], out[TOKENS], baseline[TOKENS])
    return out


def _at_budget(curve: pd.DataFrame, metric: str, budget: float) -> float:
    """A run's metric at ``budget`` cumulative tokens, linear between its evaluations; NaN when
    the budget lies outside the curve (never the nearest end's value)."""
    points = curve.sort_values(TOKENS)
    tokens = points[TOKENS].to_numpy(float)
    if not tokens[0] <= budget <= tokens[-1]:
        return float("nan")
    return float(np.interp(budget, tokens, points[metric].to_numpy(float)))


def budget_values(
    curves: pd.DataFrame, results: pd.DataFrame, factors: list[str], metric: str
) -> tuple[pd.DataFrame, float, int] | None:
    """(results with ``metric`` replaced by its value at the common budget, budget, runs not
    reached) or None.

    The budget is the smallest final token count of any run, so no curve is read past its end. A
    run whose curve starts past the budget (its first evaluation already generated more tokens)
    has no value there: it is "not reached", left out and counted, not given its first value.
    None when the curves lack cumulative ``tokens_generated`` or the metric, or a run of
    ``results`` has no curve with at least two evaluations.
    """
    if TOKENS not in curves.columns or metric not in curves.columns:
        return None
    usable = curves.dropna(subset=[TOKENS, metric])
    runs = {key: rows for key, rows in usable.groupby([*factors, SEED_COLUMN]) if rows[TOKENS].nunique() >= 2}
    keys = [tuple(row) for row in results[[*factors, SEED_COLUMN]].itertuples(index=False)]
    if not keys or any(key not in runs for key in keys):
        return None
    budget = min(float(runs[key][TOKENS].max()) for key in keys)
    if budget <= 0:
        return None
    values = np.array([_at_budget(runs[key], metric, budget) for key in keys])
    reached = ~np.isnan(values)
    return results.assign(**{metric: values})[reached].reset_index(drop=True), budget, int((~reached).sum())
