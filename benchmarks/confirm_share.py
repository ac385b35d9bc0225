"""Confirm mode: the share of the fixed design's runs an adaptive design needs when it watches only
the predicted terms, at the fixed design's power on them.

The world is `adaptive_sim.py`'s (a 2^5 factorial, planted factorial effects a = 2 pp and b:c =
1.5 pp, every other effect 0, run noise sd 1.5 pp, a seed effect shared by a seed's cells, sd 1
pp), and the yardstick is the same fixed design: the full 2^5 at 3 seeds (96 runs), judged by the
same rule in one final look (``look(..., final=True)`` with the same watched terms and alpha).
The adaptive design is the real one: the scheduler's own ``look`` / ``next_stage`` with
``SequentialSettings.watch`` (confirm mode), stage 1 the resolution V half fraction at
``--first-seeds`` seeds, then whatever ``next_stage`` picks (a seed in every cell: 16 runs; the
noisier half of the cells: 8; a fold-over), Pocock-type spending, and a run budget ``max_runs``.
For each budget in ``--budgets`` the script simulates ``--experiments`` experiments (fixed seed)
and prints the power on each watched term, the runs used on average and their share of 96; the
smallest budget whose power reaches the fixed design's is the answer.

Two scenarios:

The effect of interest (``--delta``, the spec's ``effect_of_interest``) matters in confirm mode: a
watched term whose repeated interval lies inside +-delta is decided ``not supported`` and stops
being watched, so a delta near the predicted effect itself (2 pp for a 1.5 pp term) rules a real
effect out too often (1-3 points of power at the budgets tried); the defaults are below the
watched effects (1 pp, 0.5 pp).

- ``bound`` (default): the named term b:c alone is watched, tested at alpha / 14 = 0.00357 (the
  level ``adaptive_bound.py`` tests it at, Holm's second step among 15 terms), so the share is
  comparable with that script's oracle (the same term, level and effect with the noise known, z
  tests, looks every 16 runs from 32: 58% at a maximum of 112 runs, Pocock-type); the oracle's
  figure for each budget is printed beside the real design's;
- ``pair``: a confirm experiment as a user would run it: the two predicted terms a and b:c
  watched at alpha = 0.05 (Holm over the two), with the interaction planted at ``--scale`` 2/3 of
  its size (1 pp) so the fixed design's power is not ~100%.

    nice .venv/bin/python benchmarks/confirm_share.py --experiments 300 --budgets 96,112,128
    nice .venv/bin/python benchmarks/confirm_share.py --experiments 300 --scenario pair --budgets 80,96,128
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adaptive_bound  # noqa: E402 - the oracle of the same setting
from adaptive_sim import FACTORS, FIXED_SEEDS, SEED_SD, World, factorial_truth  # noqa: E402

from dapo_ablate.reports.power import half_fraction  # noqa: E402
from dapo_ablate.reports.sequential import (  # noqa: E402
    STOP, SUPPORTED, AdaptivePolicy, SequentialSettings, look, next_stage,
)  # fmt: skip
from dapo_ablate.reports.simulate import wilson_interval  # noqa: E402

FIXED_RUNS = 2 ** len(FACTORS) * FIXED_SEEDS
SCENARIOS = {
    "bound": {"planted": {("a",): 0.02, ("b", "c"): 0.015}, "watch": ("b:c",), "alpha": 0.05 / 14, "delta": 0.01},
    "pair": {"planted": {("a",): 0.02, ("b", "c"): 0.01}, "watch": ("a", "b:c"), "alpha": 0.05, "delta": 0.005},
}


def adaptive(world: World, settings: SequentialSettings, policy: AdaptivePolicy, first_seeds: int):
    """(final look, runs used): the stages until next_stage says stop (as the scheduler runs them)."""
    results = world.runs([(int(m), s) for m in half_fraction(len(FACTORS)) for s in range(first_seeds)])
    current = look(results, FACTORS, settings)
    while (stage := next_stage(current, policy)).action != STOP:
        added = world.runs([(mask, first + j) for mask, first, count in stage.runs for j in range(count)])
        results = pd.concat([results, added], ignore_index=True)
        current = look(results, FACTORS, settings, current.history, final=stage.final)
    return current, len(results)


def claimed(final, watch: tuple[str, ...]) -> dict[str, bool]:
    """Per watched term: decided supported on the planted (positive) side, i.e. confirmed."""
    terms = final.terms.set_index("term")
    return {term: terms.loc[term, "decision"] == SUPPORTED and terms.loc[term, "estimate"] > 0 for term in watch}


def simulate(scenario: dict, budget: int, args, seed: int) -> dict:
    """The adaptive design at ``budget`` runs and the fixed design, on the same simulated worlds."""
    rng = np.random.default_rng(seed)
    truth = factorial_truth({term: effect * args.scale for term, effect in scenario["planted"].items()})
    watch = scenario["watch"]
    delta = args.delta if args.delta is not None else scenario["delta"]
    settings = SequentialSettings(budget, delta=delta, spending="pocock", alpha=scenario["alpha"], watch=watch)
    fixed_settings = SequentialSettings(FIXED_RUNS, delta=delta, alpha=scenario["alpha"], watch=watch)
    policy = AdaptivePolicy(seeds_per_look=1, max_seeds=args.max_seeds, max_runs=budget)
    out = {"runs": [], "adaptive": [], "fixed": [], "looks": []}
    for _ in range(args.experiments):
        world = World(truth, rng.normal(0.0, SEED_SD, args.max_seeds + FIXED_SEEDS + 1), rng)
        final, runs = adaptive(world, settings, policy, args.first_seeds)
        fixed_world = World(truth, world.seed_effects, rng)
        fixed_cells = [(m, s) for m in range(2 ** len(FACTORS)) for s in range(FIXED_SEEDS)]
        fixed = look(fixed_world.runs(fixed_cells), FACTORS, fixed_settings, final=True)
        out["runs"].append(runs)
        out["looks"].append(final.index)
        out["adaptive"].append(claimed(final, watch))
        out["fixed"].append(claimed(fixed, watch))
    return out


def share(hits: list[bool]) -> str:
    low, high = wilson_interval(int(np.sum(hits)), len(hits))
    return f"{np.mean(hits):.1%} ({low:.1%}-{high:.1%})"


def oracle_column(name: str, budget: int) -> str:
    """adaptive_bound's exact oracle at this maximum (its setting is the ``bound`` scenario's)."""
    if name != "bound" or (budget - 32) % 16:
        return "-"
    power, runs = adaptive_bound.oracle(16, budget, "pocock")
    return f"{power:.1%}, {runs:.1f} ({runs / FIXED_RUNS:.0%})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=300)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="bound")
    parser.add_argument("--budgets", default="64,80,96,112,128", help="max_runs values to try (comma-separated)")
    parser.add_argument("--first-seeds", type=int, default=2, help="seeds per cell of stage 1 (the half fraction)")
    parser.add_argument("--max-seeds", type=int, default=12, help="per cell (the run budget binds first)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the planted effects")
    parser.add_argument("--delta", type=float, default=None,
                        help="effect_of_interest in metric units (futility: an interval inside +-delta stops a term "
                             "'not supported'); default 0.01 (bound) or 0.005 (pair), below the watched effect")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start, scenario = time.perf_counter(), SCENARIOS[args.scenario]
    watch = scenario["watch"]
    print(f"scenario {args.scenario}: planted {scenario['planted']} x {args.scale:g}, watched {', '.join(watch)} at "
          f"alpha {scenario['alpha']:.4g} (Holm over the watched terms), effect of interest "
          f"{args.delta if args.delta is not None else scenario['delta']:g}; {args.experiments} experiments per budget, "
          f"seed {args.seed}; stage 1 the half fraction x {args.first_seeds} seeds, Pocock-type spending")
    print(f"| max runs | power {' / '.join(watch)}, adaptive | power, fixed 96 runs | all watched confirmed, adaptive / fixed "
          "| runs, mean (share of 96) | looks, mean | oracle (adaptive_bound): power, runs |")
    print("|---:|---|---|---|---:|---:|---|")
    for budget in (int(b) for b in args.budgets.split(",")):
        out = simulate(scenario, budget, args, args.seed)
        powers = " / ".join(share([hit[t] for hit in out["adaptive"]]) for t in watch)
        fixed = " / ".join(share([hit[t] for hit in out["fixed"]]) for t in watch)
        both = f"{np.mean([all(h.values()) for h in out['adaptive']]):.1%} / {np.mean([all(h.values()) for h in out['fixed']]):.1%}"
        runs = np.mean(out["runs"])
        print(f"| {budget} | {powers} | {fixed} | {both} | {runs:.1f} ({runs / FIXED_RUNS:.0%}) | "
              f"{np.mean(out['looks']):.2f} | {oracle_column(args.scenario, budget)} |", flush=True)
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
