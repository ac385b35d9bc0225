"""Synthetic results tables with planted effects, for tests, coverage checks and power analyses.

Cell means follow a set function on the factors switched on:

    v(S) = baseline + sum_{T subset of S, T in planted} gain_T

so a planted main effect ``("a",): 0.06`` adds 6 points whenever a is on, and a planted
interaction ``("a", "b"): 0.02`` adds 2 more when both are. Each run adds a shared seed effect
(same for every cell with that seed, as when seeds fix data order and initialisation) and
independent run noise, both normal; ``noisy_cells`` makes some cells' run noise larger
(heteroscedastic cells), and ``simulate_settings`` can give each setting its own noise level.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np
import pandas as pd

from dapo_ablate.core.contracts import DEFAULT_METRIC, SEED_COLUMN, SETTING_COLUMN


def true_cell_means(factors: list[str], baseline: float, planted: dict[tuple[str, ...], float]) -> np.ndarray:
    """v(S) for every cell bitmask: shape [2**k]."""
    values = np.full(2 ** len(factors), float(baseline))
    for mask in range(2 ** len(factors)):
        on = {f for i, f in enumerate(factors) if mask >> i & 1}
        values[mask] += sum(gain for term, gain in planted.items() if set(term) <= on)
    return values


@dataclass(frozen=True)
class SimulationOptions:
    """How a simulated table is laid out and drawn, besides its seeds and noise levels."""

    metric: str = DEFAULT_METRIC
    """Name of the metric column."""
    cells: list[int] | None = None
    """The cell bitmasks that ran (e.g. a fraction); None: all 2^k."""
    rng: np.random.Generator | int = 0
    """The random generator, or its seed."""
    seeds_per_cell: bool = False
    """Seeds numbered per cell (cell j runs seeds j*seeds ...), each with its own seed effect, so
    no two cells share one."""
    noisy_cells: dict[int, float] | None = None
    """{cell bitmask: factor} multiplies that cell's run noise sd (heteroscedastic cells)."""


def simulate_results(
    factors: list[str],
    baseline: float,
    planted: dict[tuple[str, ...], float],
    seeds: int = 3,
    noise_sd: float = 0.01,
    seed_sd: float = 0.0,
    **options,
) -> pd.DataFrame:
    """A tidy results table: one row per (cell, seed), factor columns 0/1, ``seed``, the metric.

    ``options``: the fields of ``SimulationOptions`` by keyword (metric, cells, rng,
    seeds_per_cell, noisy_cells). Compute columns are filled with plausible numbers (more tokens
    when more factors are on).
    """
    layout = SimulationOptions(**options)
    rng = np.random.default_rng(layout.rng)
    truth = true_cell_means(factors, baseline, planted)
    chosen = list(layout.cells if layout.cells is not None else range(2 ** len(factors)))
    seed_effect = rng.normal(0.0, seed_sd, size=seeds * (len(chosen) if layout.seeds_per_cell else 1))
    scale = layout.noisy_cells or {}
    rows = []
    for j, (mask, s) in enumerate(product(chosen, range(seeds))):
        label = j if layout.seeds_per_cell else s
        levels = {f: mask >> i & 1 for i, f in enumerate(factors)}
        tokens = 1e6 * (10 + sum(levels.values()))
        rows.append(
            {
                **levels,
                SEED_COLUMN: label,
                layout.metric: truth[mask] + seed_effect[label] + rng.normal(0.0, noise_sd * scale.get(mask, 1.0)),
                "tokens_generated": tokens,
                "tokens_discarded": 0.1 * tokens * levels.get("dynamic_sampling", 0),
                "wall_s": tokens / 2e4,
            }
        )
    table = pd.DataFrame(rows)
    # by seed label, for coverage checks; a tuple, since pandas compares attrs with == when concatenating
    table.attrs["seed_effects"] = tuple(float(e) for e in seed_effect)
    return table


def simulate_settings(
    factors: list[str],
    baseline: float,
    planted_by_setting: dict[str, dict[tuple[str, ...], float]],
    rng: np.random.Generator | int = 0,
    noise_sd_by_setting: dict[str, float] | None = None,
    **options,
) -> pd.DataFrame:
    """A transfer study: ``simulate_results`` once per setting (its own planted effects, its own
    seed effects), stacked with a ``setting`` column. ``options`` go to ``simulate_results``;
    ``noise_sd_by_setting`` overrides ``noise_sd`` for the settings it names."""
    rng = np.random.default_rng(rng)
    parts = []
    for name, planted in planted_by_setting.items():
        own = dict(options)
        if noise_sd_by_setting and name in noise_sd_by_setting:
            own["noise_sd"] = noise_sd_by_setting[name]
        table = simulate_results(factors, baseline, planted, rng=rng, **own)
        table.insert(0, SETTING_COLUMN, name)
        table.attrs = {}
        parts.append(table)
    return pd.concat(parts, ignore_index=True)


def wilson_interval(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a share hits / n (for simulated error rates and coverage).

    Example: 15 of 300: p = .05, centre (.05 + 1.96^2 / 600) / (1 + 1.96^2 / 300) = .0557,
    half-width 1.96 sqrt(.05 x .95 / 300 + 1.96^2 / 360000) / 1.0128 = .0252: (.0305, .0808).
    """
    p = hits / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / (1 + z**2 / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)
