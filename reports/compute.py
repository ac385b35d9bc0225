"""Compute accounting per cell: what each configuration spent to get its accuracy.

Dynamic sampling can reach a score in fewer training steps while generating many more tokens
(it discards groups whose samples are all right or all wrong), so gains are also given per
million generated tokens, discarded ones included.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .table import COMPUTE_COLUMNS, cell_label, cell_masks


def gain_per_million_tokens(gain: np.ndarray, tokens_generated: np.ndarray) -> np.ndarray:
    """gain / (tokens_generated / 1e6). Example: +0.08 for 40M tokens -> 0.002 per Mtok (0.2 pp)."""
    return np.asarray(gain, float) / (np.asarray(tokens_generated, float) / 1e6)


def compute_table(results: pd.DataFrame, factors: list[str], metric: str) -> pd.DataFrame:
    """Per cell, means over seeds: metric, tokens generated (incl. discarded), tokens discarded,
    discarded share, wall seconds, tokens relative to the baseline, gain over the baseline and
    gain per million generated tokens. Missing compute columns give NaN."""
    table = results.assign(_mask=cell_masks(results, factors))
    for column in COMPUTE_COLUMNS:
        if column not in table:
            table[column] = np.nan
    grouped = table.groupby("_mask")
    cells = grouped[[metric, *COMPUTE_COLUMNS]].mean()
    cells["n"] = grouped.size()
    baseline = cells.loc[0] if 0 in cells.index else pd.Series(np.nan, index=cells.columns)
    out = pd.DataFrame(
        {
            "cell": [cell_label(int(m), factors) for m in cells.index],
            **{f: [int(m) >> i & 1 for m in cells.index] for i, f in enumerate(factors)},
            "n": cells["n"].to_numpy(),
            "mean": cells[metric].to_numpy(),
            "tokens_generated": cells["tokens_generated"].to_numpy(),
            "tokens_discarded": cells["tokens_discarded"].to_numpy(),
            "discarded_share": (cells["tokens_discarded"] / cells["tokens_generated"]).to_numpy(),
            "wall_s": cells["wall_s"].to_numpy(),
            "tokens_vs_baseline": (cells["tokens_generated"] / baseline["tokens_generated"]).to_numpy(),
            "gain": (cells[metric] - baseline[metric]).to_numpy(),
        }
    )
    out["gain_per_mtok"] = gain_per_million_tokens(out["gain"], out["tokens_generated"])
    return out
