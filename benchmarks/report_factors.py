"""Factors: the report's analysis (``reports.analyze``) on a 2^k design as k grows to the limit.

For each k, simulates the full 2^k factorial (or with ``--half`` its half fraction I = all
factors) with ``--seeds`` seeds per cell, planted main effects and one interaction, and times
``analyze`` in a fresh process (so each peak RSS is its own). One seed per cell takes the noise
from Lenth's PSE over the 2^k - 1 effects; two or more seeds use the cells' own variances with
seeds as blocks; ``--drop`` removes that many runs at random (seeds then unbalanced, so the
cell-means information matrix is no longer diagonal). ``--plan`` times ``plan-seeds``
(``reports.power.plan_seeds``) for the same k instead.

    .venv/bin/python benchmarks/report_factors.py --factors 8 10 12
    .venv/bin/python benchmarks/report_factors.py --factors 12 --seeds 2 --drop 1
    .venv/bin/python benchmarks/report_factors.py --factors 12 --half
    .venv/bin/python benchmarks/report_factors.py --factors 12 --plan
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np


def one(k: int, seeds: int, drop: int, half: bool, plan: bool) -> dict:
    """Time one analysis (or one plan) in this process."""
    from dapo_ablate.reports import analyze
    from dapo_ablate.reports.power import half_fraction, plan_seeds
    from dapo_ablate.reports.simulate import simulate_results

    factors = [f"f{i}" for i in range(k)]
    if plan:
        start = time.perf_counter()
        table = plan_seeds(factors, sigma=0.015, effect=0.02)
        return {"seconds": time.perf_counter() - start, "rows": len(table), "peak_mb": _peak_mb()}
    planted = {("f0",): 0.05, ("f1",): 0.03, ("f0", "f1"): 0.02}
    cells = [int(c) for c in half_fraction(k)] if half else None
    rng = np.random.default_rng(0)
    results = simulate_results(factors, 0.3, planted, seeds, 0.01, 0.005 if seeds > 1 else 0.0, cells=cells, rng=rng)
    if drop:
        results = results.drop(index=rng.choice(len(results), size=drop, replace=False)).reset_index(drop=True)
    start = time.perf_counter()
    analysis = analyze(results, factors)
    return {
        "seconds": time.perf_counter() - start, "runs": len(results), "cells": len(analysis.fit.masks),
        "design": analysis.design.kind, "noise": analysis.intervals["se_method"].iloc[0],
        "claims": len(analysis.claims), "peak_mb": _peak_mb(),
    }  # fmt: skip


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factors", type=int, nargs="+", default=[8, 10, 12])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--drop", type=int, default=0, help="runs removed at random (unbalanced seeds)")
    parser.add_argument("--half", action="store_true", help="the half fraction instead of the full factorial")
    parser.add_argument("--plan", action="store_true", help="time plan-seeds instead of the analysis")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before one k is given up")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.seeds, args.drop, args.half, args.plan)))
        return
    for k in args.factors:
        command = [sys.executable, __file__, "--one", str(k), "--seeds", str(args.seeds), "--drop", str(args.drop)]
        command += ["--half"] * args.half + ["--plan"] * args.plan
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=True)
            print(f"k={k}: {json.loads(done.stdout.splitlines()[-1])}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"k={k}: not done after {args.timeout:.0f} s", flush=True)
        except subprocess.CalledProcessError as error:
            print(f"k={k}: failed: {error.stderr.strip().splitlines()[-1]}", flush=True)


if __name__ == "__main__":
    main()
