"""Adaptive factorial vs the fixed 3-seed full factorial, over simulated experiments.

Each experiment plants effects on a 2^5 design (default: a 2 pp main effect on `a`, a 1.5 pp
interaction `b:c`, every other term 0; `--null`: nothing), with the noise of the built-in task as
the report benchmarks model it (run noise sd 1.5 pp, a seed effect shared by the cells of a seed,
sd 1 pp; baseline 30%). Runs are drawn as the stages ask for them:

- adaptive: stage 1 is the resolution V half fraction (16 cells) at `--first-seeds` seeds; then
  `reports.sequential.look` decides every term, `next_stage` says what to run next (fold-over,
  more seeds, the noisier cells) or to stop, and the next look is made final when the stage after
  it cannot fit; the same functions the scheduler calls;
- fixed: the full 2^5 at 3 seeds (96 runs), one look (`look(..., final=True)`: Holm over the 15
  terms at alpha, the same estimates), so both designs are judged by the same rule.

Printed: the power on each planted term (share of experiments that claim it, i.e. decide it
`supported`) for both designs, the adaptive runs on average (and as a share of 96), the share of
experiments with any false claim (a term planted 0 decided supported), the terms each design
leaves undecided, and the runs-saved estimate (``runs_saved``) beside the truth. Wilson 95%
intervals on the shares. ``--scale 2`` doubles the planted effects. What no design could do in
this setting: ``adaptive_bound.py``.

    nice .venv/bin/python benchmarks/adaptive_sim.py --experiments 300
    nice .venv/bin/python benchmarks/adaptive_sim.py --experiments 300 --null
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dapo_ablate.reports.power import half_fraction
from dapo_ablate.reports.sequential import (
    STOP, SUPPORTED, AdaptivePolicy, SequentialSettings, full_information_runs, look, next_stage, runs_saved,
)  # fmt: skip
from dapo_ablate.reports.design import contrast_column
from dapo_ablate.reports.simulate import wilson_interval

FACTORS = ["a", "b", "c", "d", "e"]
PLANTED = {("a",): 0.02, ("b", "c"): 0.015}
BASELINE, NOISE_SD, SEED_SD = 0.30, 0.015, 0.01
FIXED_SEEDS = 3


def factorial_truth(planted: dict[tuple[str, ...], float]) -> np.ndarray:
    """Cell means with the planted *factorial effects* (mean of the +1 cells minus the -1 cells of
    the term's -1/+1 column), every other effect exactly 0: v = baseline + sum_T effect_T / 2 x
    column_T. (``simulate.true_cell_means`` plants gains in 0/1 coding instead, where a 1.5 pp
    gain for b and c together is also a 0.75 pp main effect of b and of c.)"""
    masks = np.arange(2 ** len(FACTORS))
    values = np.full(len(masks), BASELINE)
    for term, effect in planted.items():
        values += effect / 2 * contrast_column(masks, tuple(FACTORS.index(f) for f in term))
    return values


@dataclass
class World:
    """One simulated experiment's truth: cell means and the seed effects (drawn once per seed)."""

    truth: np.ndarray
    seed_effects: np.ndarray
    rng: np.random.Generator

    def runs(self, cell_seeds: list[tuple[int, int]]) -> pd.DataFrame:
        """Draw runs: one row per (cell mask, seed index)."""
        masks = np.array([m for m, _ in cell_seeds])
        seeds = np.array([s for _, s in cell_seeds])
        y = self.truth[masks] + self.seed_effects[seeds] + self.rng.normal(0.0, NOISE_SD, len(masks))
        table = pd.DataFrame({f: (masks >> i) & 1 for i, f in enumerate(FACTORS)})
        table["seed"], table["avg@32"] = seeds, y
        table["tokens_generated"] = 1e6 * (10 + table[FACTORS].sum(axis=1))
        return table


def adaptive(world: World, policy: AdaptivePolicy, settings: SequentialSettings, first_seeds: int):
    """(final look, runs used, looks): the stages until next_stage says stop."""
    results = world.runs([(int(m), s) for m in half_fraction(len(FACTORS)) for s in range(first_seeds)])
    current = look(results, FACTORS, settings)
    while True:
        stage = next_stage(current, policy)
        if stage.action == STOP:
            return current, len(results)
        added = world.runs([(mask, first + j) for mask, first, count in stage.runs for j in range(count)])
        results = pd.concat([results, added], ignore_index=True)
        current = look(results, FACTORS, settings, current.history, final=stage.final)


def fixed(world: World, settings: SequentialSettings):
    results = world.runs([(m, s) for m in range(2 ** len(FACTORS)) for s in range(FIXED_SEEDS)])
    return look(results, FACTORS, settings, final=True)


def simulate(args) -> dict:
    rng = np.random.default_rng(args.seed)
    planted = {} if args.null else {term: effect * args.scale for term, effect in PLANTED.items()}
    truth = factorial_truth(planted)
    policy = AdaptivePolicy(seeds_per_look=args.seeds_per_look, max_seeds=args.max_seeds, max_runs=args.max_runs)
    settings = SequentialSettings(
        full_information_runs(len(FACTORS), args.max_seeds, args.max_runs), delta=args.delta, spending=args.spending
    )
    fixed_settings = SequentialSettings(2 ** len(FACTORS) * FIXED_SEEDS, delta=args.delta)
    names = [":".join(term) for term in planted]
    out = {"runs": [], "looks": [], "saved": [], "adaptive": {n: [] for n in names}, "fixed": {n: [] for n in names},
           "false_adaptive": [], "false_fixed": [], "undecided": [], "undecided_fixed": []}  # fmt: skip
    for _ in range(args.experiments):
        world = World(truth, rng.normal(0.0, SEED_SD, max(args.max_seeds, FIXED_SEEDS) + 1), rng)
        final, runs = adaptive(world, policy, settings, args.first_seeds)
        one_look = fixed(world, fixed_settings)
        out["runs"].append(runs)
        out["looks"].append(final.index)
        out["saved"].append(runs_saved(final, settings).fixed_runs)
        out["undecided"].append(len(final.undecided))
        out["undecided_fixed"].append(len(one_look.undecided))
        for label, table in (("adaptive", final.terms), ("fixed", one_look.terms)):
            claimed = set(table.loc[table["decision"] == SUPPORTED, "term"])
            for name in names:
                out[label][name].append(name in claimed)
            out[f"false_{label}"].append(bool(claimed - set(names)))
    return out


def share(hits) -> str:
    hits = np.asarray(hits, dtype=bool)
    low, high = wilson_interval(int(hits.sum()), len(hits))
    return f"{hits.mean():.1%} ({low:.1%}-{high:.1%})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=300)
    parser.add_argument("--null", action="store_true", help="plant no effect (every claim is false)")
    parser.add_argument("--first-seeds", type=int, default=2, help="seeds per cell of stage 1 (the half fraction)")
    parser.add_argument("--seeds-per-look", type=int, default=1)
    parser.add_argument("--max-seeds", type=int, default=4)
    parser.add_argument("--max-runs", type=int, default=None)
    parser.add_argument("--delta", type=float, default=0.02, help="effect of interest (metric units; 0.02 = 2 pp)")
    parser.add_argument("--spending", default="obrien_fleming", choices=["obrien_fleming", "pocock"])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the planted effects (2 = 4 pp and 3 pp)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    out = simulate(args)
    fixed_runs = 2 ** len(FACTORS) * FIXED_SEEDS
    runs = np.array(out["runs"])
    print(f"{args.experiments} experiments, {'no effect planted' if args.null else f'planted {PLANTED} x {args.scale:g}'}; "
          f"adaptive: half fraction x {args.first_seeds} seeds first, +{args.seeds_per_look} per look, max "
          f"{args.max_seeds} seeds, {args.spending}, delta {args.delta:g}")  # fmt: skip
    print(f"runs: adaptive mean {runs.mean():.1f} ({runs.mean() / fixed_runs:.1%} of the fixed {fixed_runs}), "
          f"median {np.median(runs):.0f}, range {runs.min()}-{runs.max()}; looks mean {np.mean(out['looks']):.2f}; "
          f"experiments ending with undecided terms {np.mean(np.array(out['undecided']) > 0):.1%}")  # fmt: skip
    print(f"terms left undecided at the end (of 15): adaptive {np.mean(out['undecided']):.2f}, "
          f"fixed {np.mean(out['undecided_fixed']):.2f} on average")
    for name in out["adaptive"]:
        print(f"power on {name}: adaptive {share(out['adaptive'][name])}, fixed {share(out['fixed'][name])}")
    print(f"any false claim: adaptive {share(out['false_adaptive'])}, fixed {share(out['false_fixed'])}")
    saved = np.array(out["saved"])
    print(f"runs_saved estimate: fixed design of equal power {np.nanmedian(saved):.0f} runs (median), "
          f"{np.nanmean(saved):.1f} mean; {time.perf_counter() - start:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
