"""Transfer under no heterogeneity: how often does a transfer report claim that an effect differs
between settings when every setting has the same effects?

Each experiment simulates three settings of DAPO's five techniques with the *same* planted
effects in each (overlong filtering +6 pp, dynamic sampling +8 pp, clip-higher x dynamic sampling
+2 pp; baseline 30%), each setting with its own seed effects (sd 1 pp) and run noise (sd 1.5 pp),
runs ``reports.transfer.analyze_transfer`` with the defaults (Holm over the transfer family of
main effects, Shapley values and two-factor interactions) and counts the experiments with any
transfer claim (any verdict "differs in size" or "flips sign"). The issue's bar: at most 7% of
300 experiments.

    .venv/bin/python benchmarks/report_transfer_null.py --experiments 300 --seeds 3
    .venv/bin/python benchmarks/report_transfer_null.py --experiments 300 --seeds 1 --design half
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports.simulate import simulate_settings
from dapo_ablate.reports.transfer import analyze_transfer

FACTORS = list(PAPER_FACTORS)
SAME = {("overlong_filter",): 0.06, ("dynamic_sampling",): 0.08, ("clip_higher", "dynamic_sampling"): 0.02}
HALF = [m for m in range(32) if bin(m).count("1") % 2 == 0]  # I = ABCDE: resolution V, 16 cells


def run(experiments: int, seeds: int, design: str, noise_sd: float, seed_sd: float, seed: int) -> pd.DataFrame:
    """One row per experiment: transfer claims, and terms per verdict."""
    rng = np.random.default_rng(seed)
    cells = HALF if design == "half" else None
    rows = []
    for _ in range(experiments):
        table = simulate_settings(
            FACTORS, 0.30, {"a": SAME, "b": SAME, "c": SAME}, rng=rng, seeds=seeds, noise_sd=noise_sd,
            seed_sd=seed_sd, cells=cells,
        )  # fmt: skip
        result = analyze_transfer(table, FACTORS)
        verdicts = result.transfer.drop_duplicates(["statistic", "term"])["verdict"].value_counts()
        rows.append({"claims": len(result.claims), **verdicts.to_dict()})
    return pd.DataFrame(rows).fillna(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--design", choices=["full", "half"], default="full")
    parser.add_argument("--noise-sd", type=float, default=0.015)
    parser.add_argument("--seed-sd", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    table = run(args.experiments, args.seeds, args.design, args.noise_sd, args.seed_sd, args.seed)
    share = float((table["claims"] > 0).mean())
    low, high = _wilson(int((table["claims"] > 0).sum()), len(table))
    print(
        f"{args.experiments} experiments, 3 settings, {args.design} design, {args.seeds} seed(s): "
        f"{share:.1%} claim any heterogeneity (95% Wilson interval {low:.1%}-{high:.1%}; bar <= 7%)"
    )
    print("terms per verdict, mean per experiment:", table.drop(columns="claims").mean().round(2).to_dict())
    print(f"wall {time.perf_counter() - start:.0f} s")


def _wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = hits / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / (1 + z**2 / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


if __name__ == "__main__":
    main()
