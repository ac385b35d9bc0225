"""Transfer verdicts on simulated studies whose truth is known: how often does a transfer report
claim a difference between settings that is not there, call a size difference a sign flip, or
miss a planted flip or a planted constant effect?

Each experiment simulates three settings (a, b, c) of DAPO's five techniques, each with its own
seed effects (sd 1 pp) and run noise (sd 1.5 pp; ``--noisy-factor`` multiplies setting c's),
runs ``reports.transfer.analyze_transfer`` with its defaults (Holm, one guarantee over the whole
report, equivalence margin 2 pp) and counts per experiment:

- ``--scenario null``: the same effects in every setting (OF +6 pp, DS +8 pp, CH x DS +2 pp), so
  any transfer claim (verdict "differs in size" or "flips sign") is false. Bar: <= 6%.
- ``--scenario size``: as null, but OF's effect is +6 / 0 / 0 pp in a / b / c: a difference in
  size, no flip, so any "flips sign" is false. Bar: <= 2%.
- ``--scenario planted``: CH +6 / +6 / -6 pp (a flip) and DS +8 pp everywhere (a constant
  effect): the share of experiments where CH's Shapley value "flips sign" and where DS's
  "transfers".

    .venv/bin/python benchmarks/report_transfer_null.py --scenario null --seeds 3 --noisy-factor 3
    .venv/bin/python benchmarks/report_transfer_null.py --scenario null --seeds 1 --design half --noisy-factor 3
    .venv/bin/python benchmarks/report_transfer_null.py --scenario size --seeds 3 --noisy-factor 3
    .venv/bin/python benchmarks/report_transfer_null.py --scenario planted --seeds 3 --design half
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports.simulate import simulate_settings, wilson_interval
from dapo_ablate.reports.transfer import analyze_transfer

FACTORS = list(PAPER_FACTORS)
OF, CH, SP, TL, DS = FACTORS
SAME = {(OF,): 0.06, (DS,): 0.08, (CH, DS): 0.02}
HALF = [m for m in range(32) if bin(m).count("1") % 2 == 0]  # I = -ABCDE: resolution V, 16 cells
SCENARIOS = {
    "null": {"a": SAME, "b": SAME, "c": SAME},
    "size": {"a": SAME, "b": {**SAME, (OF,): 0.0}, "c": {**SAME, (OF,): 0.0}},
    "planted": {"a": {(CH,): 0.06, (DS,): 0.08}, "b": {(CH,): 0.06, (DS,): 0.08}, "c": {(CH,): -0.06, (DS,): 0.08}},
}


def verdict_of(result, statistic: str, term: str) -> str:
    rows = result.transfer
    return rows.loc[(rows["statistic"] == statistic) & (rows["term"] == term), "verdict"].iloc[0]


def run(
    scenario: str, experiments: int, seeds: int, design: str, noise_sd: float, seed_sd: float, noisy_factor: float,
    seed: int,
) -> pd.DataFrame:  # fmt: skip
    """One row per experiment: transfer claims, terms per verdict, and the planted terms' verdicts."""
    rng = np.random.default_rng(seed)
    cells = HALF if design == "half" else None
    rows = []
    for _ in range(experiments):
        table = simulate_settings(
            FACTORS, 0.30, SCENARIOS[scenario], rng=rng, seeds=seeds, noise_sd=noise_sd, seed_sd=seed_sd, cells=cells,
            noise_sd_by_setting={"c": noise_sd * noisy_factor},
        )  # fmt: skip
        result = analyze_transfer(table, FACTORS)
        per_term = result.transfer.drop_duplicates(["statistic", "term"])
        verdicts = per_term["verdict"].value_counts()
        rows.append({
            "claims": len(result.claims), **verdicts.to_dict(), "raw_p": float((per_term["p_interaction"] < 0.05).mean()),
            "ch_flips": verdict_of(result, "shapley", CH) == "flips sign",
            "ds_transfers": verdict_of(result, "shapley", DS) == "transfers",
            "of_differs": verdict_of(result, "shapley", OF) in ("differs in size", "flips sign"),
        })  # fmt: skip
    return pd.DataFrame(rows).fillna(0)



def share(flags: pd.Series) -> str:
    low, high = wilson_interval(int(flags.sum()), len(flags))
    return f"{flags.mean():.1%} ({int(flags.sum())} of {len(flags)}; 95% Wilson {low:.1%}-{high:.1%})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="null")
    parser.add_argument("--experiments", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--design", choices=["full", "half"], default="full")
    parser.add_argument("--noise-sd", type=float, default=0.015)
    parser.add_argument("--seed-sd", type=float, default=0.01)
    parser.add_argument("--noisy-factor", type=float, default=1.0, help="setting c's run noise sd, times --noise-sd")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    table = run(
        args.scenario, args.experiments, args.seeds, args.design, args.noise_sd, args.seed_sd, args.noisy_factor,
        args.seed,
    )  # fmt: skip
    print(
        f"scenario {args.scenario}: {args.experiments} experiments, 3 settings, {args.design} design, {args.seeds} "
        f"seed(s), setting c's noise x{args.noisy_factor:g}"
    )
    print(f"  any transfer claim (differs in size or flips sign): {share(table['claims'] > 0)}")
    print(f"  any 'flips sign': {share(table.get('flips sign', pd.Series(0, index=table.index)) > 0)}")
    print(f"  CH's Shapley value 'flips sign': {share(table['ch_flips'])}")
    print(f"  DS's Shapley value 'transfers': {share(table['ds_transfers'])}")
    print(f"  OF's Shapley value 'differs in size' or 'flips sign': {share(table['of_differs'])}")
    print(f"  terms whose Welch test has raw p < 0.05 (calibration; 5% when no term differs): {table['raw_p'].mean():.1%}")
    verdicts = table.drop(columns=["claims", "ch_flips", "ds_transfers", "of_differs", "raw_p"]).mean().round(2).to_dict()
    print(f"  terms per verdict, mean per experiment: {verdicts}")
    print(f"  wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
