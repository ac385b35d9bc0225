"""Coverage of the report's 95% intervals on simulated factorials with planted effects.

Each experiment simulates a full 2^5 factorial over DAPO's five techniques with planted main
effects, two-factor interactions and a three-factor interaction (so Shapley and Banzhaf values
differ), a shared per-seed effect and run noise, then runs ``reports.analyze`` and checks
whether each interval covers the planted value: Shapley and Banzhaf values (bootstrap over
seeds), the paper-order step gains (bootstrap) and the main and two-factor effects (OLS).

    .venv/bin/python benchmarks/report_coverage.py --experiments 400 --seeds 3
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from dapo_ablate.reports import PAPER_FACTORS, analyze
from dapo_ablate.reports.design import all_terms, contrast_column, term_name
from dapo_ablate.reports.orderings import cumulative_means, path_masks
from dapo_ablate.reports.shapley import banzhaf_values, shapley_values
from dapo_ablate.reports.simulate import simulate_results, true_cell_means

FACTORS = list(PAPER_FACTORS)
PLANTED = {
    ("overlong_filter",): 0.06,
    ("clip_higher",): 0.02,
    ("soft_overlong",): 0.03,
    ("token_level_loss",): 0.01,
    ("dynamic_sampling",): 0.08,
    ("clip_higher", "dynamic_sampling"): 0.03,
    ("overlong_filter", "soft_overlong"): -0.02,
    ("overlong_filter", "clip_higher", "dynamic_sampling"): 0.04,
}


def planted_values(factors: list[str], truth: np.ndarray) -> dict[str, pd.Series]:
    """The estimands computed from the noiseless cell means."""
    cells = np.arange(2 ** len(factors))
    effects = {
        term_name(t, factors): float(contrast_column(cells, t) @ truth) / 2 ** (len(factors) - 1)
        for t in all_terms(len(factors), 2)
    }
    return {
        "shapley": pd.Series(shapley_values(truth), index=factors),
        "banzhaf": pd.Series(banzhaf_values(truth), index=factors),
        "paper_delta": pd.Series(cumulative_means(truth, path_masks(list(PAPER_FACTORS), factors))[1][1:]),
        "effects": pd.Series(effects),
    }


def covered(analysis, planted: dict[str, pd.Series]) -> dict[str, np.ndarray]:
    """Per family, whether each interval covers its planted value."""
    shap = analysis.shapley.set_index("factor")
    steps = analysis.cumulative[analysis.cumulative["step"] > 0].reset_index(drop=True)
    effects = analysis.effects.set_index("term")
    inside = lambda value, low, high: (low <= value) & (value <= high)  # noqa: E731
    return {
        "shapley": inside(planted["shapley"], shap["ci_low"], shap["ci_high"]).to_numpy(),
        "banzhaf": inside(planted["banzhaf"], shap["banzhaf_ci_low"], shap["banzhaf_ci_high"]).to_numpy(),
        "paper_delta": inside(
            planted["paper_delta"], steps["delta_ci_low"], steps["delta_ci_high"]
        ).to_numpy(),
        "effects": inside(planted["effects"], effects["ci_low"], effects["ci_high"]).to_numpy(),
    }


def run(
    experiments: int, seeds: int, noise_sd: float, seed_sd: float, n_boot: int, seed: int
) -> pd.DataFrame:
    """Coverage per family over ``experiments`` simulated factorials."""
    truth = true_cell_means(FACTORS, 0.30, PLANTED)
    planted = planted_values(FACTORS, truth)
    hits: dict[str, list[np.ndarray]] = {family: [] for family in planted}
    rng = np.random.default_rng(seed)
    for experiment in range(experiments):
        results = simulate_results(FACTORS, 0.30, PLANTED, seeds, noise_sd, seed_sd, rng=rng)
        analysis = analyze(results, FACTORS, seed=experiment, n_boot=n_boot)
        for family, inside in covered(analysis, planted).items():
            hits[family].append(inside)
    rows = []
    for family, per_experiment in hits.items():
        stacked = np.stack(per_experiment)
        rows.append(
            {
                "family": family,
                "intervals": stacked.size,
                "coverage": stacked.mean(),
                "experiments_all_covered": stacked.all(axis=1).mean(),
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--noise-sd", type=float, default=0.015)
    parser.add_argument("--seed-sd", type=float, default=0.01)
    parser.add_argument("--n-boot", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    table = run(args.experiments, args.seeds, args.noise_sd, args.seed_sd, args.n_boot, args.seed)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"{args.experiments} experiments, {args.seeds} seeds per cell, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
