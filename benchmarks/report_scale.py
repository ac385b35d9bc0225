"""Scale: the report's inference on a large results table with thousands of seeds, in memory.

Simulates a full 2^5 factorial with ``--seeds`` seeds per cell (3,125 seeds x 32 cells =
100,000 runs by default) and seed block effects, drops 1% of the runs at random (so the seeds
are unbalanced), then runs ``reports.analyze`` and times it. The seeds enter as blocks through
the within-seed form: the largest matrices are cells x seeds counts (sparse) and cells x cells,
never a dense runs x seeds dummy matrix (100,000 x 3,125 doubles would be 2.5 GB).

    .venv/bin/python benchmarks/report_scale.py --seeds 3125
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from dapo_ablate.reports import PAPER_FACTORS, analyze
from dapo_ablate.reports.simulate import simulate_results

FACTORS = list(PAPER_FACTORS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3125)
    parser.add_argument("--drop", type=float, default=0.01, help="share of runs dropped at random")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    results = simulate_results(FACTORS, 0.30, {("dynamic_sampling",): 0.02}, args.seeds, 0.015, 0.01, rng=rng)
    results = results.sample(frac=1 - args.drop, random_state=1).reset_index(drop=True)
    simulated = time.perf_counter() - start
    start = time.perf_counter()
    analysis = analyze(results, FACTORS)
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{len(results):,} runs, {results['seed'].nunique():,} seeds, {len(analysis.fit.masks)} cells: "
        f"analyze {elapsed:.1f} s (simulation {simulated:.1f} s), peak RSS {peak:.0f} MB, "
        f"residual df {analysis.fit.df:,.0f}, seeds as blocks: {analysis.fit.blocked}, claims {len(analysis.claims)}"
    )


if __name__ == "__main__":
    main()
