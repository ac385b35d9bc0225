"""Compute-curve fits over simulated experiments: do the intervals cover the planted effects?

Each experiment is a full 2^5 factorial at `--seeds` seeds; every run's eval metric follows
R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) at `--points` evaluations (C = 0 and log-spaced
cumulative tokens from 2e5 to 2e7), with planted main effects as -1/+1 contrasts: factor a moves
the asymptote A by `--asymptote-effect` (default 3 pp), factor b moves log C_mid by
`--midpoint-effect` (default -0.3: 26% less compute to half the gain), c, d, e nothing. Around the
cell's values each run draws its own A (sd 1 pp) and log C_mid (sd 0.1), and each evaluation its
own noise (sd 1 pp; the built-in task's avg@32 over 64 problems x 32 samples has about that).
B = 1.5, R0 = 0.30.

`reports.compute_curves.analyze_curves` fits every experiment; printed: per parameter and factor
the share of 95% intervals that cover the planted value (Wilson 95% interval on the share), the
share of experiments whose verdict is the planted one (a: moves the ceiling, b: only the speed,
c-e: neither), and the time.

    nice .venv/bin/python benchmarks/compute_curves_sim.py --experiments 300
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from dapo_ablate.reports.compute_curves import CEILING, NEITHER, SPEED, analyze_curves, saturating_curve
from dapo_ablate.reports.simulate import wilson_interval

FACTORS = ["a", "b", "c", "d", "e"]
R0, A, LOG_MID, B = 0.30, 0.60, np.log(3e6), 1.5
RUN_A_SD, RUN_LOG_MID_SD, EVAL_SD = 0.01, 0.1, 0.01


def experiment(rng: np.random.Generator, seeds: int, points: int, effects: tuple[float, float]) -> pd.DataFrame:
    """One experiment's curve table (the shape store.results.curves_frame writes)."""
    tokens = np.concatenate([[0.0], np.geomspace(2e5, 2e7, points - 1)])
    masks = np.repeat(np.arange(2 ** len(FACTORS)), seeds)
    levels = (masks[:, None] >> np.arange(len(FACTORS))) & 1  # [runs, factors]
    top = A + effects[0] * (levels[:, 0] - 0.5) + rng.normal(0, RUN_A_SD, len(masks))
    mid = np.exp(LOG_MID + effects[1] * (levels[:, 1] - 0.5) + rng.normal(0, RUN_LOG_MID_SD, len(masks)))
    y = saturating_curve(tokens[None, :], R0, top[:, None], mid[:, None], B)
    y = y + rng.normal(0, EVAL_SD, y.shape)
    table = pd.DataFrame({f: np.repeat(levels[:, i], points) for i, f in enumerate(FACTORS)})
    table["seed"] = np.repeat(np.tile(np.arange(seeds), 2 ** len(FACTORS)), points)
    table["step"] = np.tile(np.arange(points) * 10, len(masks))
    table["avg@32"], table["tokens_generated"] = y.ravel(), np.tile(tokens, len(masks))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--points", type=int, default=9, help="evaluations per run, the one at C = 0 included")
    parser.add_argument("--asymptote-effect", type=float, default=0.03)
    parser.add_argument("--midpoint-effect", type=float, default=-0.3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    effects = (args.asymptote_effect, args.midpoint_effect)
    planted = {
        "asymptote": np.array([effects[0], 0, 0, 0, 0]),
        "midpoint": np.array([0, effects[1], 0, 0, 0]),
    }
    expected = [CEILING, SPEED, NEITHER, NEITHER, NEITHER]
    covered = {name: [] for name in planted}
    right, fitted, start = [], [], time.perf_counter()
    for _ in range(args.experiments):
        result = analyze_curves(experiment(rng, args.seeds, args.points, effects), FACTORS)
        e = result.effects
        for name in planted:
            low, high = e[f"{name}_ci_low"].to_numpy(float), e[f"{name}_ci_high"].to_numpy(float)
            covered[name].append((low <= planted[name]) & (planted[name] <= high))
        right.append(e["verdict"].to_numpy() == np.array(expected))
        fitted.append(result.runs["fitted"].mean())
    print(f"{args.experiments} experiments, 2^5 x {args.seeds} seeds, {args.points} evaluations per run; planted: "
          f"a moves A by {effects[0]:+g}, b moves log C_mid by {effects[1]:+g}; runs fitted {np.mean(fitted):.1%}")  # fmt: skip
    for name, hits in covered.items():
        hits = np.array(hits)
        per_factor = ", ".join(f"{f} {hits[:, i].mean():.1%}" for i, f in enumerate(FACTORS))
        low, high = wilson_interval(int(hits.sum()), hits.size)
        print(f"95% intervals covering the planted {name} effect: {hits.mean():.1%} ({low:.1%}-{high:.1%}) of "
              f"{hits.size}; by factor {per_factor}")  # fmt: skip
    right = np.array(right)
    print("verdict as planted: " + ", ".join(f"{f} ({expected[i]}) {right[:, i].mean():.1%}" for i, f in enumerate(FACTORS)))
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
