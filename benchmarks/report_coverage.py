"""Coverage of the report's 95% intervals on simulated factorials with planted effects.

Each experiment simulates a full 2^5 factorial over DAPO's five techniques with planted main
effects, two-factor interactions and a three-factor interaction (so Shapley and Banzhaf values
differ), a shared per-seed effect (sd 1 pp) and run noise (sd 1.5 pp), runs ``reports.analyze``
and checks whether each interval covers the planted value, for every estimand the report gives:
cells, cumulative means and step gains (paper order), gains by position (orderings), Shapley,
Banzhaf, leave-one-out, add-one, order gaps and the factorial effects (main + two-factor).

Settings: ``balanced`` (every cell runs seeds 0..s-1), ``missing`` (one run, chosen at random,
is dropped), ``per-cell-seeds`` (seeds numbered per cell, so no two cells share a seed and the
seed effect is part of the run noise).

Levels (cells, cumulative means) under seeds as blocks estimate the cell mean for *these*
seeds: the planted value plus the mean of the seeds' effects. ``cells_population`` checks the
cells' intervals over new seeds (cells.csv ``seed_ci_low``/``seed_ci_high``, seed effects
counted as random) against the planted population mean.

Heteroscedastic cells: ``--noisy-cells K --noise-factor F`` gives K cells, drawn at random in
each experiment, F times the run noise sd (``--noisy-where corners``: the cells the headline and
the Shapley values lean on most, GRPO, full DAPO, OF alone and all but OF). ``--null`` plants no
effect at all and also counts the experiments with any claim in claims.csv (every claim false).

    .venv/bin/python benchmarks/report_coverage.py --setting balanced --experiments 400
    .venv/bin/python benchmarks/report_coverage.py --null --noisy-cells 4 --noise-factor 3 --seeds 2 --experiments 300
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from dapo_ablate.reports import PAPER_FACTORS, analyze
from dapo_ablate.reports import shapley as sv
from dapo_ablate.reports.design import all_terms, contrast_column, term_name
from dapo_ablate.reports.orderings import cumulative_means, path_masks, position_means
from dapo_ablate.reports.simulate import simulate_results, true_cell_means

FACTORS = list(PAPER_FACTORS)
SETTINGS = ("balanced", "missing", "per-cell-seeds")
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


def planted_values(truth: np.ndarray, shift: float) -> dict[str, np.ndarray]:
    """Every estimand from the noiseless cell means (levels shifted by ``shift``)."""
    cells = np.arange(32)
    paper = path_masks(FACTORS, FACTORS)
    means, deltas = cumulative_means(truth, paper)
    return {
        "cells": truth + shift,
        "cells_population": truth,
        "cumulative_mean": means + shift,
        "cumulative_delta": deltas[1:],
        "orderings": np.concatenate([position_means(truth, i) for i in range(5)]),
        "shapley": sv.shapley_values(truth),
        "banzhaf": sv.banzhaf_values(truth),
        "leave_one_out": sv.leave_one_out(truth),
        "add_one": sv.add_one(truth),
        "order_gap": sv.leave_one_out(truth) - sv.add_one(truth),
        "effects": np.array([contrast_column(cells, t) @ truth / 16 for t in all_terms(5, 2)]),
    }


def intervals(analysis) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(low, high) per estimand, in the order of ``planted_values``."""
    cum = analysis.cumulative
    shapley, loo = analysis.shapley, analysis.leave_one_out
    effects = analysis.effects.set_index("term").loc[[term_name(t, FACTORS) for t in all_terms(5, 2)]]
    pair = lambda table, low, high: (table[low].to_numpy(float), table[high].to_numpy(float))  # noqa: E731
    return {
        "cells": pair(analysis.cells, "ci_low", "ci_high"),
        "cells_population": pair(analysis.cells, "seed_ci_low", "seed_ci_high"),
        "cumulative_mean": pair(cum, "ci_low", "ci_high"),
        "cumulative_delta": pair(cum[cum["step"] > 0], "delta_ci_low", "delta_ci_high"),
        "orderings": pair(analysis.orderings, "ci_low", "ci_high"),
        "shapley": pair(shapley, "ci_low", "ci_high"),
        "banzhaf": pair(shapley, "banzhaf_ci_low", "banzhaf_ci_high"),
        "leave_one_out": pair(loo, "loo_ci_low", "loo_ci_high"),
        "add_one": pair(loo, "add_one_ci_low", "add_one_ci_high"),
        "order_gap": pair(analysis.order_gaps, "ci_low", "ci_high"),
        "effects": pair(effects, "ci_low", "ci_high"),
    }


CORNERS = (0, 31, 1, 30)  # GRPO, full DAPO, OF alone, all but OF: the Shapley values' heaviest cells


def noisy_cells(count: int, factor: float, where: str, rng: np.random.Generator) -> dict[int, float]:
    """{cell: noise factor} for ``count`` cells: drawn at random, or the corners first."""
    cells = CORNERS[:count] if where == "corners" else rng.choice(32, size=count, replace=False)
    return {int(c): factor for c in cells}


def simulate(
    setting: str, seeds: int, noise_sd: float, seed_sd: float, rng: np.random.Generator, planted=None, noisy=None
) -> pd.DataFrame:
    results = simulate_results(
        FACTORS, 0.30, PLANTED if planted is None else planted, seeds, noise_sd, seed_sd, rng=rng,
        seeds_per_cell=setting == "per-cell-seeds", noisy_cells=noisy,
    )  # fmt: skip
    if setting == "missing":
        effects = results.attrs["seed_effects"]
        results = results.drop(index=int(rng.integers(len(results)))).reset_index(drop=True)
        results.attrs["seed_effects"] = effects
    return results


def run(
    setting: str, experiments: int, seeds: int, noise_sd: float, seed_sd: float, seed: int, *, null: bool = False,
    noisy: int = 0, noise_factor: float = 3.0, where: str = "random",
) -> pd.DataFrame:  # fmt: skip
    """Coverage per estimand over ``experiments`` simulated factorials (with ``null``, a last row
    ``any claim``: the share of experiments with a claim)."""
    effects = {} if null else PLANTED
    truth = true_cell_means(FACTORS, 0.30, effects)
    rng = np.random.default_rng(seed)
    hits: dict[str, list[np.ndarray]] = {}
    claimed = []
    for _ in range(experiments):
        cells = noisy_cells(noisy, noise_factor, where, rng) if noisy else None
        results = simulate(setting, seeds, noise_sd, seed_sd, rng, effects, cells)
        analysis = analyze(results, FACTORS)
        claimed.append(len(analysis.claims) > 0)
        shift = float(np.mean(results.attrs["seed_effects"])) if analysis.fit.blocked else 0.0
        planted = planted_values(truth, shift)
        for name, (low, high) in intervals(analysis).items():
            hits.setdefault(name, []).append((low <= planted[name]) & (planted[name] <= high))
    rows = []
    for name, per_experiment in hits.items():
        stacked = np.stack(per_experiment)
        rows.append({"estimand": name, "intervals": stacked.size, "coverage": stacked.mean()})
    if null:
        rows.append({"estimand": "any claim", "intervals": experiments, "coverage": float(np.mean(claimed))})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=SETTINGS, default="balanced")
    parser.add_argument("--experiments", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--noise-sd", type=float, default=0.015)
    parser.add_argument("--seed-sd", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--null", action="store_true", help="plant no effect; also count experiments with a claim")
    parser.add_argument("--noisy-cells", type=int, default=0, help="cells with --noise-factor times the noise sd")
    parser.add_argument("--noise-factor", type=float, default=3.0)
    parser.add_argument("--noisy-where", choices=["random", "corners"], default="random")
    args = parser.parse_args()
    start = time.perf_counter()
    table = run(
        args.setting, args.experiments, args.seeds, args.noise_sd, args.seed_sd, args.seed, null=args.null,
        noisy=args.noisy_cells, noise_factor=args.noise_factor, where=args.noisy_where,
    )  # fmt: skip
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    intervals = table[table["estimand"] != "any claim"]
    print(f"all intervals: {np.average(intervals['coverage'], weights=intervals['intervals']):.3f}; lowest estimand "
          f"{intervals['coverage'].min():.3f}")
    print(
        f"setting {args.setting}: {args.experiments} experiments, {args.seeds} seeds per cell"
        + (f", {args.noisy_cells} {args.noisy_where} cells with {args.noise_factor:g}x the noise sd" if args.noisy_cells else "")
        + (", no effect planted" if args.null else "")
        + f", {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
