"""reports/spending.py and reports/sequential.py: alpha spending, group-sequential boundaries against published tables,
looks (decisions and repeated intervals), the next-stage policy and runs saved."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dapo_ablate.reports.design import contrast_column
from dapo_ablate.reports.multiplicity import holm
from dapo_ablate.reports.power import half_fraction
from dapo_ablate.reports.sequential import (
    FOLD_OVER,
    NOISY_CELLS,
    NOT_SUPPORTED,
    NOT_WATCHED,
    SEEDS,
    STOP,
    SUPPORTED,
    UNDECIDED,
    AdaptivePolicy,
    SequentialHistory,
    SequentialSettings,
    full_information_runs,
    look,
    next_stage,
    runs_saved,
    watched,
)  # fmt: skip
from dapo_ablate.reports.spending import (
    boundaries,
    exit_probabilities,
    obrien_fleming,
    pocock,
)
from dapo_ablate.reports.table import ReportInputError

from support import ROOT

FACTORS = ["a", "b", "c", "d", "e"]


def test_spending_functions_by_hand():
    # O'Brien-Fleming type, alpha .05, t = .5: z_{.9875} = 2.2414 / sqrt(.5) = 3.1698; per side
    # 2 - 2 Phi(3.1698) = .001526, both sides .003052
    assert obrien_fleming(0.5, 0.05) == pytest.approx(0.003052, abs=2e-6)
    assert obrien_fleming(1.0, 0.05) == pytest.approx(0.05, abs=1e-12)
    # Pocock type: .05 ln(1 + (e - 1) .5) = .05 ln(1.859141) = .05 x .620115 = .031006
    assert pocock(0.5, 0.05) == pytest.approx(0.031006, abs=2e-6)
    assert pocock(1.0, 0.05) == pytest.approx(0.05, abs=1e-12)


# Lan-DeMets O'Brien-Fleming-type spending, two-sided alpha = .05 (.025 per side), equally spaced
# looks: rpact getDesignGroupSequential(typeOfDesign = "asOF", sided = 2, alpha = .05) and gsDesign
# (sfLDOF, alpha = .025, symmetric):
#   K = 2: 2.963 1.969;  K = 3: 3.710 2.511 1.993;  K = 4: 4.333 2.963 2.359 2.014;
#   K = 5: 4.877 3.357 2.680 2.290 2.031
OBF_TABLE = {
    2: [2.963, 1.969],
    3: [3.710, 2.511, 1.993],
    4: [4.333, 2.963, 2.359, 2.014],
    5: [4.877, 3.357, 2.680, 2.290, 2.031],
}
# Pocock-type spending, same setting, K = 5 (DeMets & Lan 1994, Table I: 2.44 2.43 2.41 2.40 2.39):
POCOCK_K5 = [2.438, 2.427, 2.410, 2.397, 2.386]


@pytest.mark.parametrize("looks", sorted(OBF_TABLE))
def test_obrien_fleming_boundaries_match_the_published_table(looks):
    fractions = np.arange(1, looks + 1) / looks
    assert boundaries(fractions, 0.05) == pytest.approx(OBF_TABLE[looks], abs=1.5e-3)


def test_pocock_boundaries_match_the_published_table():
    assert boundaries(np.arange(1, 6) / 5, 0.05, "pocock") == pytest.approx(POCOCK_K5, abs=1.5e-3)


@pytest.mark.parametrize(
    "looks, obf, pocock_constant",
    # Jennison & Turnbull (2000), Tables 2.1 and 2.3: two-sided alpha = .05, equal spacing;
    # O'Brien-Fleming c_k = C_B sqrt(K / k), Pocock c_k = C_P
    [(2, 1.977, 2.178), (3, 2.004, 2.289), (4, 2.024, 2.361), (5, 2.040, 2.413)],
)
def test_the_integration_gives_the_classic_designs_their_level(looks, obf, pocock_constant):
    fractions = np.arange(1, looks + 1) / looks
    classic_obf = obf * np.sqrt(looks / np.arange(1, looks + 1))
    # the constants are rounded to 3 decimals, so the level is .05 to about 3e-4
    assert exit_probabilities(classic_obf, fractions).sum() == pytest.approx(0.05, abs=5e-4)
    assert exit_probabilities([pocock_constant] * looks, fractions).sum() == pytest.approx(0.05, abs=5e-4)


def test_each_look_spends_its_increment_and_unequal_looks_work():
    fractions = [0.2, 0.45, 0.8, 1.0]
    bounds = boundaries(fractions, 0.01)
    spent = np.cumsum(exit_probabilities(bounds, fractions))
    assert spent == pytest.approx(obrien_fleming(np.array(fractions), 0.01), abs=2e-6)
    # one look at full information is the plain two-sided test: z_{1 - .05/2} = 1.95996
    assert boundaries([1.0], 0.05) == pytest.approx([1.959964], abs=1e-5)
    # the first look alone: P(|Z| >= c_1) = alpha(t_1)
    assert boundaries([0.3], 0.05)[0] == pytest.approx(stats.norm.isf(obrien_fleming(0.3, 0.05) / 2), abs=1e-9)


def test_power_under_a_drift_matches_the_fixed_design_for_one_look():
    # one look: power = Phi(drift - 1.96) + Phi(-drift - 1.96); drift 2.8 -> .7995 + ~0
    assert exit_probabilities([1.959964], [1.0], drift=2.8).sum() == pytest.approx(0.79955, abs=1e-4)


def test_bad_fractions_are_refused():
    with pytest.raises(ValueError, match="rise strictly"):
        boundaries([0.5, 0.5], 0.05)
    with pytest.raises(ValueError, match="spending"):
        boundaries([1.0], 0.05, "haybittle")


def _table(effects: dict[tuple[int, ...], float], cells, seeds: int, rng, noise=0.015, seed_sd=0.01, first_seed=0):
    """Runs with planted factorial effects (mean of +1 cells minus -1 cells) over ``cells``."""
    rng = np.random.default_rng(rng)
    cells = np.asarray(list(cells))
    seed_effect = rng.normal(0, seed_sd, first_seed + seeds)
    rows = []
    for mask in cells:
        mean = 0.3 + sum(e / 2 * contrast_column(np.array([mask]), term)[0] for term, e in effects.items())
        for s in range(first_seed, first_seed + seeds):
            rows.append({**{f: (mask >> i) & 1 for i, f in enumerate(FACTORS)}, "seed": s,
                         "avg@32": mean + seed_effect[s] + rng.normal(0, noise), "tokens_generated": 1e6})  # fmt: skip
    return pd.DataFrame(rows)


def test_one_final_look_is_holm_on_the_reports_welch_p_values():
    table = _table({(0,): 0.03, (1, 2): 0.02}, range(32), 3, rng=4)
    settings = SequentialSettings(full_information_runs=96)
    result = look(table, FACTORS, settings, final=True)
    terms = result.terms.set_index("term")
    # one look at t = 1 spends all of alpha / r: the boundary is z_{1 - alpha / (2 r)}
    first = terms["boundary"].max()
    assert first == pytest.approx(stats.norm.isf(0.05 / 15 / 2), abs=1e-6)
    p = 2 * stats.t.sf(np.abs(terms["estimate"] / terms["se"]), terms["df"])
    claimed_by_holm = set(terms.index[holm(p) < 0.05])
    assert set(terms.index[terms["decision"] == SUPPORTED]) == claimed_by_holm
    assert {"a", "b:c"} <= claimed_by_holm
    # the RCI of a supported term excludes 0 and is estimate +/- t_df(tail of the boundary) se
    row = terms.loc["a"]
    q = stats.t.isf(stats.norm.sf(row["boundary"]), row["df"])
    assert row["ci_low"] == pytest.approx(row["estimate"] - q * row["se"])
    assert row["ci_low"] > 0


def test_a_look_decides_futility_and_keeps_decisions():
    table = _table({(0,): 0.04}, range(32), 6, rng=1, noise=0.005, seed_sd=0.002)
    settings = SequentialSettings(full_information_runs=32 * 8, delta=0.02)
    first = look(table, FACTORS, settings)
    decisions = dict(zip(first.terms["term"], first.terms["decision"]))
    assert decisions["a"] == SUPPORTED
    assert sum(d == NOT_SUPPORTED for d in decisions.values()) == 14  # every null term's RCI inside +/- 2 pp
    assert first.terms.loc[first.terms["term"] == "b", "information"].item() == pytest.approx(6 / 8)
    # decisions are sticky, and the history survives a JSON round trip (the ledger's record)
    history = SequentialHistory.from_dict(first.to_dict()["history"])
    again = look(table, FACTORS, settings, history, final=True)
    assert dict(zip(again.terms["term"], again.terms["decision"])) == decisions
    assert history.fractions["a"] == pytest.approx((0.75,))
    assert again.history.fractions["a"] == pytest.approx((0.75, 1.0))  # a final look spends the rest at t = 1
    assert next_stage(again, AdaptivePolicy()).action == STOP


def test_the_same_look_again_gives_the_same_decisions():
    table = _table({(0,): 0.02}, half_fraction(5), 2, rng=2)
    settings = SequentialSettings(full_information_runs=128)
    first = look(table, FACTORS, settings)
    resumed = look(table, FACTORS, settings, first.history)  # no new runs: the same look, not a second one
    assert resumed.history.fractions["a"] == first.history.fractions["a"]
    pd.testing.assert_series_equal(first.terms["decision"], resumed.terms["decision"])
    # half fraction x 2 seeds of a full factorial x 4: t = 32 / 128
    assert first.terms["information"].to_numpy() == pytest.approx(0.25)


def test_the_first_stage_of_a_resolution_v_fraction_is_folded_over():
    table = _table({}, half_fraction(5), 2, rng=3)
    first = look(table, FACTORS, SequentialSettings(full_information_runs=128))
    assert first.design == "fraction" and first.resolution == 5
    stage = next_stage(first, AdaptivePolicy(max_seeds=4))
    # every cell carries every effect alike: the fold-over (16 new cells x 2 seeds) adds as much
    # information per run as one more seed everywhere, and wins the tie (it also de-aliases)
    assert stage.action == FOLD_OVER and stage.run_count == 32
    assert {mask for mask, _, _ in stage.runs} == set(range(32)) - set(half_fraction(5).tolist())
    assert all(first_seed == 0 and count == 2 for _, first_seed, count in stage.runs)


def test_an_ambiguous_alias_chain_is_folded_over():
    cells = [m for m in range(32) if bin(m & 0b01111).count("1") % 2 == 0]  # I = ABCD: resolution IV
    table = _table({}, cells, 2, rng=5)
    first = look(table, FACTORS, SequentialSettings(full_information_runs=128))
    assert first.resolution == 4 and first.terms["ambiguous"].any()
    assert next_stage(first, AdaptivePolicy(max_seeds=4)).action == FOLD_OVER


def test_the_noisier_cells_get_the_seeds_when_they_are_much_noisier():
    table = _table({}, range(32), 6, rng=6, noise=0.002, seed_sd=0.0)
    noisy = table["a"] == 1  # half the cells 20x noisier
    table.loc[noisy, "avg@32"] += np.random.default_rng(7).normal(0, 0.04, noisy.sum())
    first = look(table, FACTORS, SequentialSettings(full_information_runs=32 * 8, delta=0.002))
    stage = next_stage(first, AdaptivePolicy(max_seeds=8))
    # the noisy half gets one more seed each: Neyman allocation puts the runs where sigma_j is large
    assert stage.action == NOISY_CELLS
    assert {mask for mask, _, _ in stage.runs} == {m for m in range(32) if m & 1}
    assert all(first_seed == 6 and count == 1 for _, first_seed, count in stage.runs)


def test_budgets_stop_or_shorten_the_experiment():
    table = _table({}, range(32), 2, rng=8)
    first = look(table, FACTORS, SequentialSettings(full_information_runs=96))
    assert next_stage(first, AdaptivePolicy(max_seeds=2)).action == STOP
    assert next_stage(first, AdaptivePolicy(max_seeds=6, max_runs=70)).action == STOP
    # room for exactly one more seed everywhere: that stage's look is the final one
    stage = next_stage(first, AdaptivePolicy(max_seeds=6, max_runs=96))
    assert stage.action == SEEDS and stage.final and stage.run_count == 32
    # tokens: 64 runs of 1M each used; 20M more allow only the 16 noisier cells
    tokens = next_stage(first, AdaptivePolicy(max_seeds=6, max_tokens=64e6 + 20e6))
    assert tokens.action == NOISY_CELLS and tokens.final


def test_full_information_runs_and_bad_input():
    assert full_information_runs(5, 6) == 192 and full_information_runs(5, 6, max_runs=100) == 100
    table = _table({}, range(32), 2, rng=9).drop(columns=["e"])
    with pytest.raises(ReportInputError, match="'e'"):
        look(table, FACTORS, SequentialSettings(full_information_runs=96))


def test_runs_saved_of_one_full_look_is_about_none():
    table = _table({(0,): 0.02}, range(32), 3, rng=10)
    settings = SequentialSettings(full_information_runs=96)
    saved = runs_saved(look(table, FACTORS, settings, final=True), settings)
    # one look at the fixed design's information and level: the fixed design of equal power is itself
    assert saved.runs_used == 96
    assert saved.fixed_runs == pytest.approx(96, rel=0.02)
    assert "runs" in saved.sentence()


def _adaptive(rng: np.random.Generator, settings: SequentialSettings, policy: AdaptivePolicy) -> set[str]:
    seed_effect = rng.normal(0, 0.01, 8)

    def draw(pairs):
        masks, seeds = np.array([m for m, _ in pairs]), np.array([s for _, s in pairs])
        table = pd.DataFrame({f: (masks >> i) & 1 for i, f in enumerate(FACTORS)})
        table["seed"], table["avg@32"] = seeds, 0.3 + seed_effect[seeds] + rng.normal(0, 0.015, len(masks))
        return table

    results = draw([(int(m), s) for m in half_fraction(5) for s in range(2)])
    current = look(results, FACTORS, settings)
    while (stage := next_stage(current, policy)).action != STOP:
        added = draw([(mask, first + j) for mask, first, count in stage.runs for j in range(count)])
        results = pd.concat([results, added], ignore_index=True)
        current = look(results, FACTORS, settings, current.history, final=stage.final)
    return set(current.terms.loc[current.terms["decision"] == SUPPORTED, "term"])


def _bound_module():
    import importlib.util

    path = ROOT / "benchmarks" / "adaptive_bound.py"
    spec = importlib.util.spec_from_file_location("adaptive_bound", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_adaptive_bound_agrees_with_a_simulation_of_its_oracle():
    """benchmarks/adaptive_bound.py's argument (benchmarks/README.md): its exact oracle figures
    match a direct simulation, sit above Wald's bound, and deciding every term costs more."""
    bound = _bound_module()
    power, runs = bound.oracle(16, 112, "pocock")
    looks = np.arange(32, 113, 16, dtype=float)
    crossing = boundaries(looks / 112, bound.LEVEL, "pocock")
    z = bound._paths(looks, bound.THETA, np.random.default_rng(0), 200_000)
    hit = z >= crossing
    first = np.where(hit.any(axis=1), looks[hit.argmax(axis=1)], 112.0)
    assert hit.any(axis=1).mean() == pytest.approx(power, abs=0.002)
    assert first.mean() == pytest.approx(runs, abs=0.3)
    assert bound.wald_bound(power) < runs < 0.6 * bound.FIXED_RUNS
    every, every_runs, false = bound.every_term(16, 128, "pocock", 1 - bound.fixed_power(), np.random.default_rng(1), 20_000)
    assert every >= bound.fixed_power() - 0.01 and every_runs > 0.85 * bound.FIXED_RUNS and false < 0.06


# --- confirm mode: only the predicted terms are watched --------------------------------------------------------


def _confirm_table() -> pd.DataFrame:
    """A half fraction at 2 seeds whose b:c interaction (planted 2.5 pp) reads between the boundary
    of a one-term family at alpha and that of fifteen terms at alpha / 15 at the first look."""
    for seed in range(200):
        table = _table({(1, 2): 0.025}, half_fraction(5), 2, rng=seed)
        one = look(table, FACTORS, SequentialSettings(128, spending="pocock", watch=("b:c",)))
        every = look(table, FACTORS, SequentialSettings(128, spending="pocock"))
        decided = lambda result: dict(zip(result.terms["term"], result.terms["decision"]))  # noqa: E731
        if decided(one)["b:c"] == SUPPORTED and decided(every)["b:c"] == UNDECIDED:
            return table
    raise AssertionError("no seed reads between the two boundaries")


def test_confirm_mode_watches_only_the_predicted_terms_and_stops_when_they_are_decided():
    table = _confirm_table()
    settings = SequentialSettings(128, spending="pocock", watch=("b:c",))
    result = look(table, FACTORS, settings)
    decisions = dict(zip(result.terms["term"], result.terms["decision"]))
    assert decisions.pop("b:c") == SUPPORTED
    assert set(decisions.values()) == {NOT_WATCHED}  # every other term estimated, none decided
    others = result.terms[result.terms["term"] != "b:c"]
    assert others["estimate"].notna().all() and others["ci_low"].isna().all()
    # one watched term: Holm's family is that term alone, tested at alpha (not alpha / 15)
    row = result.terms.set_index("term").loc["b:c"]
    assert row["level"] == pytest.approx(0.05)
    assert row["ci_low"] > 0
    stage = next_stage(result, AdaptivePolicy(max_seeds=4))
    assert stage.action == STOP and stage.reason == "every watched term is decided"
    assert result.to_dict()["watch"] == ["b:c"]
    history = SequentialHistory.from_dict(result.to_dict()["history"])  # the ledger's JSON round trip
    assert set(history.decided) == {"b:c"}  # an unwatched term is never decided
    again = look(table, FACTORS, settings, history, final=True)
    assert dict(zip(again.terms["term"], again.terms["decision"]))["a"] == NOT_WATCHED
    assert runs_saved(result, settings).term == "b:c"
    # watching every term (the default) the same data leave b:c undecided and the experiment goes on
    every = look(table, FACTORS, SequentialSettings(128, spending="pocock"))
    assert dict(zip(every.terms["term"], every.terms["decision"]))["b:c"] == UNDECIDED
    assert next_stage(every, AdaptivePolicy(max_seeds=4)).action != STOP
    assert "watch" not in every.to_dict()


def test_confirm_mode_matches_alias_chains_and_refuses_terms_it_cannot_estimate():
    assert watched(["a", "a:b = c:d", "c"], ("c:d",)).tolist() == [False, True, False]
    assert watched(["a", "b"], None).tolist() == [True, True]
    table = _table({}, half_fraction(5), 2, rng=3)
    with pytest.raises(ReportInputError, match="confirm.terms"):
        look(table, FACTORS, SequentialSettings(128, watch=("a:b:c",)))
