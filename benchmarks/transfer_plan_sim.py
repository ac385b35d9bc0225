"""Does `plan-seeds` for a transfer study keep its word? Each row plans seeds per cell with
``reports.transfer_power`` (what `plan-seeds` prints), then simulates 300 transfer studies run with
those seeds and counts how often the report gives the verdict planned for:

- ``transfers``: the same effects in every setting (OF +6, DS +8, CH x DS +2 pp); the share of
  studies whose report calls DS "transfers" within the margin;
- ``differs``: DS's effect differs by the planned size between the two least precise settings
  (the others at their inverse-variance midpoint, the arrangement the plan is for); the share
  whose report calls DS "differs in size" or "flips sign";
- ``budget``: seeds fixed; the plan's "what a budget buys" (the smallest margin, or the smallest
  difference, reached with 80% power) planted, so the share should be about 80%.

Each setting has its own seed effects (sd 1 pp) and run noise (its own sd, the row's ``sds``).
The studies are simulated and analysed as arrays (numpy), not one report at a time: each
setting's cells' own residual variances with seeds as blocks, every term's estimate, SE and
Welch-Satterthwaite df as ``reports.inference`` computes them for a balanced design, then the
report's own verdict functions (``heterogeneity.*_many``, ``heterogeneity.verdicts_of``) with Holm
over the transfer family and Bonferroni over the report's families. The first ``--check``
studies of every row are also run through ``reports.transfer.analyze_transfer`` itself, and the
script stops if any term's verdict or Welch p-value differs.

    .venv/bin/python benchmarks/transfer_plan_sim.py --experiments 300
    .venv/bin/python benchmarks/transfer_plan_sim.py --rows differs-3-noisy --experiments 300
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from dapo_ablate.core.contracts import DEFAULT_METRIC, SEED_COLUMN, SETTING_COLUMN
from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports import shapley as sv
from dapo_ablate.reports import transfer_power as tp
from dapo_ablate.reports.design import describe_design
from dapo_ablate.reports.effects import effect_contrasts, model_prediction_map
from dapo_ablate.reports.heterogeneity import excluded_beyond_many, flip_p_many, verdicts_of, welch_heterogeneity_many
from dapo_ablate.reports.multiplicity import across_families, bonferroni, holm
from dapo_ablate.reports.power import half_fraction
from dapo_ablate.reports.simulate import true_cell_means, wilson_interval
from dapo_ablate.reports.transfer import analyze_transfer

FACTORS = list(PAPER_FACTORS)
OF, CH, SP, TL, DS = FACTORS
SAME = {(OF,): 0.06, (DS,): 0.08, (CH, DS): 0.02}
MARGIN = 0.02  # the report's default --equivalence-margin, 2 pp


@dataclass(frozen=True)
class Row:
    name: str
    verdict: str  # transfers | differs
    sds: tuple[float, ...]  # run noise sd per setting, pp
    design: str = "full"  # full | half
    statistic: str = "shapley"  # shapley | main: the statistic whose plan is checked (DS's)
    size: float = 4.0  # differs: the difference planned for, pp
    allocation: str = tp.EQUAL
    budget: tuple[int, ...] | None = None  # seeds given: plant what they buy


ROWS = [
    Row("transfers-2", "transfers", (1.5, 1.5)),
    Row("transfers-3", "transfers", (1.5, 1.5, 1.5)),
    Row("transfers-3-noisy", "transfers", (1.5, 1.5, 4.5)),
    Row("transfers-3-noisy-by-noise", "transfers", (1.5, 1.5, 4.5), allocation=tp.BY_NOISE),
    Row("transfers-readme-sds-half", "transfers", (1.1, 2.1, 1.9), design="half"),
    Row("transfers-3-main", "transfers", (1.5, 1.5, 4.5), statistic="main"),
    Row("differs-2", "differs", (1.5, 1.5)),
    Row("differs-3-noisy", "differs", (1.5, 1.5, 4.5)),
    Row("differs-3-noisy-by-noise", "differs", (1.5, 1.5, 4.5), allocation=tp.BY_NOISE),
    Row("differs-readme-sds-half", "differs", (1.1, 2.1, 1.9), design="half", size=3.0),
    Row("budget-transfers-3-seeds", "transfers", (1.5, 1.5, 4.5), budget=(3, 3, 3)),
    Row("budget-differs-3-seeds", "differs", (1.5, 1.5, 4.5), budget=(3, 3, 3)),
]


@dataclass(frozen=True)
class Terms:
    """Every term a transfer report judges, as contrast rows over the observed cells."""

    keys: list[tuple[str, str]]  # (statistic, term) in the report's order: main, shapley, interaction
    rows: np.ndarray  # [T, m]
    cells: np.ndarray  # [m] bitmasks
    families: int


def report_terms(design: str) -> Terms:
    cells = np.arange(32) if design == "full" else half_fraction(5)
    info = describe_design(cells, 5)
    effects = effect_contrasts(info, FACTORS, np.eye(len(cells)), max_order=2)
    value_map = np.eye(len(cells)) if info.kind == "full" else model_prediction_map(info, np.eye(len(cells)))
    shapley = sv.shapley_matrix(5) @ value_map
    keys = [("main", n) for n, o in zip(effects.names, effects.orders) if o == 1]
    keys += [("shapley", f) for f in FACTORS]
    keys += [("interaction", n) for n, o in zip(effects.names, effects.orders) if o == 2]
    rows = np.vstack([effects.contrasts[effects.orders == 1], shapley, effects.contrasts[effects.orders == 2]])
    return Terms(keys, rows, cells, families=5)


def plan(row: Row, terms: Terms) -> tuple[np.ndarray, float, float, float]:
    """(seeds per setting, the plan's power, the size planted, the margin) from the product."""
    label = "Shapley value" if row.statistic == "shapley" else "main or interaction effect"
    prefix = "full" if row.design == "full" else "half"
    test = next(t for t in tp.transfer_tests(FACTORS) if t.design.startswith(prefix) and label in t.statistic)
    sigmas = np.array(row.sds) / 100
    planner = tp.Planner(test, sigmas)
    if row.budget is not None:
        seeds = np.array(row.budget)
        margin, difference = tp.detectable(planner, seeds, 0.8)
        size = difference if row.verdict == tp.DIFFERS else 0.0
        margin = margin if row.verdict == tp.TRANSFERS else MARGIN
        return seeds, planner.power(seeds, row.verdict, size, margin if row.verdict == tp.TRANSFERS else np.inf), size, margin
    size = row.size / 100 if row.verdict == tp.DIFFERS else 0.0
    found = tp.seeds_for(planner, row.verdict, size, MARGIN if row.verdict == tp.TRANSFERS else np.inf, 0.8, row.allocation)
    return found.seeds, found.power, size, MARGIN


def planted(row: Row, size: float, seeds: np.ndarray, test_rows: np.ndarray) -> list[dict]:
    """Each setting's planted effects: SAME, and for ``differs`` DS's effect moved so that the
    settings' DS values are the plan's ``least_favourable`` arrangement."""
    if row.verdict == tp.TRANSFERS:
        return [SAME] * len(seeds)
    sigmas = np.array(row.sds) / 100
    c2 = float(np.sum(test_rows**2))
    true_se = sigmas * np.sqrt(c2 / seeds)
    shift = tp.least_favourable(size, true_se) - tp.AWAY * true_se.max()
    return [{**SAME, (DS,): SAME[(DS,)] + float(d)} for d in shift]


def simulate(row: Row, terms: Terms, seeds: np.ndarray, effects: list[dict], experiments: int, rng) -> list[np.ndarray]:
    """Per setting, the runs' metric [experiments, cells, seeds]: cell mean + seed effect + noise."""
    out = []
    for n, sd, planted_effects in zip(seeds, row.sds, effects):
        truth = true_cell_means(FACTORS, 0.30, planted_effects)[terms.cells]
        seed_effect = rng.normal(0.0, 0.01, size=(experiments, 1, n))
        noise = rng.normal(0.0, sd / 100, size=(experiments, len(terms.cells), n))
        out.append(truth[None, :, None] + seed_effect + noise)
    return out


def estimates(y: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each term's estimate, SE and df in one setting, [experiments, T]: each cell's own residual
    variance in the cells + seeds model (balanced: s_j^2 = sum_s r_js^2 / nu, nu = (n-1)(m-1)/m),
    Var = sum_j c_j^2 s_j^2 / n on Welch-Satterthwaite df."""
    _, m, n = y.shape
    means = y.mean(axis=2)
    residual = y - means[:, :, None] - y.mean(axis=1, keepdims=True) + y.mean(axis=(1, 2), keepdims=True)
    nu = (n - 1) * (m - 1) / m
    s2 = (residual**2).sum(axis=2) / nu
    weights = rows**2 / n  # [T, m]
    variance = s2 @ weights.T
    df = variance**2 / ((s2**2) @ (weights**2).T / nu)
    return means @ rows.T, np.sqrt(variance), df


def across(per_setting: list[tuple], terms: Terms) -> tuple[np.ndarray, ...]:
    """(Welch p adjusted, Welch p, flips p adjusted, excluded_beyond), each [experiments, T],
    as the report computes and adjusts them (Holm within the transfer family, Bonferroni over the
    T x S simultaneous intervals behind the flips, both times the report's families)."""
    theta, se, df = (np.stack([p[i] for p in per_setting], axis=-1) for i in range(3))
    s, t = theta.shape[-1], theta.shape[1]
    p_welch = welch_heterogeneity_many(theta, se, df)[3]
    p_each = 2 * stats.t.sf(np.abs(theta) / se, df)
    p_flip = flip_p_many(theta, p_each)
    p_adjusted = across_families(np.stack([holm(p) for p in p_welch]), terms.families, "holm")
    flip_adjusted = across_families(bonferroni(p_flip, t * s), terms.families, "holm")
    excluded = excluded_beyond_many(theta, se, df, 0.05)
    return p_adjusted, p_welch, flip_adjusted, excluded


def table_of(y: list[np.ndarray], terms: Terms, experiment: int) -> pd.DataFrame:
    """One simulated study as the report reads it (a setting column, factor columns, seed, metric)."""
    frames = []
    for index, values in enumerate(y):
        m, n = values.shape[1:]
        cells = np.repeat(terms.cells, n)
        frame = pd.DataFrame({f: (cells >> i) & 1 for i, f in enumerate(FACTORS)})
        frame.insert(0, SETTING_COLUMN, f"s{index}")
        frame[SEED_COLUMN] = np.tile(np.arange(n), m)
        frame[DEFAULT_METRIC] = values[experiment].reshape(-1)
        frame["tokens_generated"], frame["tokens_discarded"], frame["wall_s"] = 1e6, 0.0, 1.0
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def check(y, terms: Terms, words: np.ndarray, p_welch: np.ndarray, count: int, margin: float) -> None:
    """The first ``count`` studies through analyze_transfer: the same verdict and Welch p for every term."""
    for e in range(min(count, len(words))):
        report = analyze_transfer(table_of(y, terms, e), FACTORS, equivalence_margin=margin).transfer
        report = report.drop_duplicates(["statistic", "term"]).set_index(["statistic", "term"])
        for j, key in enumerate(terms.keys):
            theirs = report.loc[key]
            if theirs["verdict"] != words[e, j] or not np.isclose(theirs["p_interaction"], p_welch[e, j], rtol=1e-8):
                sys.exit(f"study {e}, {key}: the report says {theirs['verdict']} (p {theirs['p_interaction']:.6g}), "
                         f"the arrays {words[e, j]} (p {p_welch[e, j]:.6g})")


def run_row(row: Row, experiments: int, checks: int, rng) -> dict:
    terms = report_terms(row.design)
    key = ("shapley" if row.statistic == "shapley" else "main", DS)
    j = terms.keys.index(key)
    seeds, planned_power, size, margin = plan(row, terms)
    y = simulate(row, terms, seeds, planted(row, size, seeds, terms.rows[j]), experiments, rng)
    p_adjusted, p_welch, flip_adjusted, excluded = across([estimates(v, terms.rows) for v in y], terms)
    words = verdicts_of(np.ones_like(p_adjusted, dtype=bool), flip_adjusted, p_adjusted, excluded, margin, 0.05)
    check(y, terms, words, p_welch, checks, margin)
    wanted = ("transfers",) if row.verdict == tp.TRANSFERS else ("differs in size", "flips sign")
    hits = np.isin(words[:, j], wanted)
    low, high = wilson_interval(int(hits.sum()), len(hits))
    return {
        "row": row.name, "design": row.design, "statistic": f"{key[0]} {DS}", "sds (pp)": " / ".join(f"{s:g}" for s in row.sds),
        "verdict": row.verdict, "size (pp)": round(100 * (margin if row.verdict == tp.TRANSFERS else size), 2),
        "seeds": " / ".join(map(str, seeds)), "runs": int(seeds.sum()) * len(terms.cells),
        "planned": planned_power, "simulated": hits.mean(), "wilson": f"{low:.1%}-{high:.1%}",
        "simulated - planned": hits.mean() - planned_power,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=300)
    parser.add_argument("--check", type=int, default=5, help="studies per row also run through analyze_transfer")
    parser.add_argument("--rows", default="all", help="comma-separated row names, or all")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    chosen = ROWS if args.rows == "all" else [r for r in ROWS if r.name in args.rows.split(",")]
    rng = np.random.default_rng(args.seed)
    out = []
    for row in chosen:
        start = time.perf_counter()
        out.append(run_row(row, args.experiments, args.check, rng))
        print(f"{row.name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    table = pd.DataFrame(out)
    print(table.to_markdown(index=False, floatfmt=".3f"))
    print(f"largest |simulated - planned|: {table['simulated - planned'].abs().max():.3f}; "
          f"lowest simulated: {table['simulated'].min():.3f}")


if __name__ == "__main__":
    main()
