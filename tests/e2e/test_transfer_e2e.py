"""The slower cases of tests/unit/test_transfer.py (transfer reports rendered in full, and simulated
experiments): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dapo_ablate.reports import ReportOptions, analyze
from dapo_ablate.reports.claims import CLAIM_COLUMNS
from dapo_ablate.reports.heterogeneity import (
    welch_heterogeneity,
)
from dapo_ablate.reports.multiplicity import holm, lenth_bar
from dapo_ablate.reports.simulate import simulate_settings
from dapo_ablate.reports.summary import summary_sections
from dapo_ablate.reports.transfer import TRANSFER_COLUMNS, VERDICTS, analyze_transfer
from dapo_ablate.reports.transfer_report import claims_frame, write_transfer_report

from test_transfer import (  # noqa: F401, F811 - shared with the fast part
    CH,
    DS,
    FACTORS,
    HALF,
    PLANTED,
    TABLES,
    _equivalence,
    _term,
    planted_report,
)


def test_flipped_effect_is_flips_sign_on_simultaneous_intervals(planted_report):
    out, _ = planted_report
    transfer = pd.read_csv(out / "transfer.csv")
    for statistic in ("main", "shapley"):
        rows = _term(transfer, statistic, CH)
        assert len(rows) == 3 and set(rows.index) == set(PLANTED)
        assert set(rows["verdict"]) == {"flips sign"}
        assert (rows["p_flip_adjusted"] < 0.05).all() and (rows["p_adjusted"] >= rows["p_interaction"]).all()
        assert rows.loc["base", "sim_ci_high"] < 0 < rows.loc["short", "sim_ci_low"]
        assert (rows["sim_ci_low"] < rows["ci_low"]).all()  # simultaneous intervals are the wider ones


def test_equal_effect_transfers_within_the_margin(planted_report):
    out, _ = planted_report
    transfer = pd.read_csv(out / "transfer.csv")
    rows = transfer[(transfer["term"] == DS) & transfer["statistic"].isin(["main", "shapley"])]
    assert set(rows["verdict"]) == {"transfers"}
    assert (rows["p_adjusted"] >= 0.05).all() and (rows["excluded_beyond"] < 0.02).all()
    assert rows["estimate"].between(0.06, 0.10).all()  # each setting recovers the planted +8 pp


def test_transfer_csv_contract_and_tables_per_setting(planted_report):
    out, output = planted_report
    transfer = pd.read_csv(out / "transfer.csv")
    assert list(transfer.columns) == TRANSFER_COLUMNS
    for column in ("term", "setting", "estimate", "ci_low", "ci_high", "p_interaction", "p_adjusted", "q", "i2", "verdict"):
        assert column in transfer.columns
    assert set(transfer["verdict"]) <= set(VERDICTS)
    assert not transfer.duplicated(["statistic", "term", "setting"]).any()
    per_term = transfer.groupby(["statistic", "term"])
    assert (per_term["setting"].count() == 3).all()
    for column in ("p_interaction", "p_adjusted", "p_flip_adjusted", "q", "i2", "verdict", "detectable_difference",
                   "excluded_beyond"):
        assert (per_term[column].nunique(dropna=False) == 1).all(), column  # one value per term
    for name in TABLES:  # one CSV each, not a file per setting
        table = pd.read_csv(out / f"{name}.csv")
        assert table.columns[0] == "setting"
        if len(table):
            assert set(table["setting"]) == set(PLANTED)
    claims = pd.read_csv(out / "claims.csv")
    assert list(claims.columns) == ["setting", *CLAIM_COLUMNS]
    across = claims[claims["kind"] == "transfer"]
    assert set(across["setting"]) == {"all"} and (across["p_adjusted"] < 0.05).all()
    assert set(across["family"]) == {"flips"} and any(t.startswith("shapley clip_higher") for t in across["term"])
    assert not any("dynamic_sampling" in t for t in across["term"])
    ranks = pd.read_csv(out / "rank_agreement.csv")
    assert len(ranks) == 3 and ranks["kendall_tau"].between(-1, 1).all()
    assert (out / "transfer.png").read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.md").read_text()
    assert "flips sign between settings" in report and "# Setting base" in report
    assert "Supported by the data" in output and "family-wise error rate of the whole claims list" in output


def test_the_same_number_has_one_interval_in_transfer_csv_and_the_settings_tables(planted_report):
    out, _ = planted_report
    transfer = pd.read_csv(out / "transfer.csv")
    shapley = pd.read_csv(out / "shapley.csv").set_index(["setting", "factor"])
    effects = pd.read_csv(out / "effects.csv").set_index(["setting", "term"])
    for row in transfer.itertuples(index=False):
        own = shapley.loc[(row.setting, row.term)] if row.statistic == "shapley" else effects.loc[(row.setting, row.term)]
        value = own["shapley"] if row.statistic == "shapley" else own["effect"]
        assert (row.estimate, row.ci_low, row.ci_high) == pytest.approx((value, own["ci_low"], own["ci_high"]), abs=1e-12)


def test_one_seed_takes_each_settings_own_lenth_pse(tmp_path):
    factors = ["a", "b", "c", "d"]
    planted = {"x": {("a",): 0.1}, "y": {("a",): 0.1}, "z": {("a",): -0.1}}
    table = simulate_settings(factors, 0.3, planted, rng=2, seeds=1, noise_sd=0.005, noise_sd_by_setting={"z": 0.02})
    result = analyze_transfer(table, factors)
    for name in ("x", "y", "z"):
        alone = analyze(table[table["setting"] == name].drop(columns="setting"), factors)
        assert result.analyses[name].lenth["pse"] == pytest.approx(alone.lenth["pse"])
        row = _term(result.transfer, "main", "b").loc[name]
        assert row["se"] == pytest.approx(alone.lenth["pse"]) and row["df"] == pytest.approx(15 / 3)
    assert result.analyses["z"].lenth["pse"] > 2 * result.analyses["x"].lenth["pse"]
    # the bar each setting's summary prints is the one its claims used: Lenth's simultaneous rule over
    # the 45 effects of the three settings, at the 5% split over the report's families
    for name, analysis in result.analyses.items():
        lenth, n_families = analysis.lenth, result.guarantee.n_families
        assert lenth["over"] == 45 and lenth["bar"] == pytest.approx(lenth_bar(lenth["pse"], 5, 45, 0.05, n_families))
        tests = analysis.tests[analysis.tests["family"] == "interactions"]
        sizes = analysis.effects.set_index("term").loc[tests["term"], "effect"].abs()
        assert set(tests.loc[tests["claimed"], "term"]) == set(sizes[sizes > lenth["bar"]].index)
        printed = " ".join(summary_sections(analysis)["Not supported by the data"])
        assert f"claimed only past {100 * lenth['bar']:.1f} pp" in printed and "45 effects of all the settings" in printed
    written = write_transfer_report(table, factors, tmp_path, ReportOptions(formats=("csv", "md")))
    text = written["report.md"].read_text()
    assert "x: Lenth's PSE of its own 15 effects" in text and "never pooled" in text


def test_flips_sign_needs_simultaneous_not_unadjusted_intervals():
    """+3 / -3 pp with SE ~1 pp: each 95% interval excludes zero on its own side, but the
    simultaneous intervals (every term in every setting) do not. Fails if "flips sign" reads the
    unadjusted intervals."""
    factors = ["a", "b", "c"]
    planted = {"x": {("a",): 0.03}, "y": {("a",): -0.03}}
    hits = 0
    for seed in range(6):
        table = simulate_settings(factors, 0.4, planted, rng=seed, seeds=2, noise_sd=0.02, seed_sd=0.0)
        result = analyze_transfer(table, factors)
        rows = _term(result.transfer, "main", "a")
        marginal_flip = rows.loc["x", "ci_low"] > 0 > rows.loc["y", "ci_high"]
        simultaneous_flip = rows.loc["x", "sim_ci_low"] > 0 > rows.loc["y", "sim_ci_high"]
        assert (rows["verdict"].iloc[0] == "flips sign") == simultaneous_flip
        hits += marginal_flip and not simultaneous_flip
        # the simultaneous level: alpha / (F families x T terms x S settings), on each setting's own t
        n_terms = result.transfer.drop_duplicates(["statistic", "term"]).shape[0]
        sim_alpha = 0.05 / (result.guarantee.n_families * n_terms * 2)
        assert result.simultaneous_alpha == pytest.approx(sim_alpha)
        half = stats.t.ppf(1 - sim_alpha / 2, rows["df"]) * rows["se"]
        np.testing.assert_allclose(rows["sim_ci_high"] - rows["estimate"], half)
    assert hits >= 1  # the case the rule is for did occur


def test_transfers_only_below_the_margin_and_inconclusive_above(planted_report):
    out, _ = planted_report
    transfer = pd.read_csv(out / "transfer.csv").drop_duplicates(["statistic", "term"])
    quiet = transfer[~transfer["verdict"].isin(["flips sign", "differs in size"])]
    assert ((quiet["verdict"] == "transfers") == (quiet["excluded_beyond"] < 0.02)).all()
    table = pd.read_csv(out.parent / "results.csv")
    tight = analyze_transfer(table, FACTORS, equivalence_margin=0.005).transfer.drop_duplicates(["statistic", "term"])
    assert "transfers" not in set(tight["verdict"]) and "inconclusive" in set(tight["verdict"])


def test_one_guarantee_covers_every_claim_of_the_report(planted_report):
    """Each setting's claims are adjusted with the other settings' and the transfer tests: the
    attribution family pools the 3 settings' Shapley values (Holm over 15), times F families."""
    out, _ = planted_report
    table = pd.read_csv(out.parent / "results.csv")
    result = analyze_transfer(table, FACTORS)
    families = result.guarantee.families
    assert set(families) == {"attribution", "interactions", "order", "transfer", "flips"}
    tests = pd.concat([result.analyses[s].tests for s in result.settings], ignore_index=True)
    shapley = tests[tests["family"] == "attribution"]
    assert len(shapley) == 15
    np.testing.assert_allclose(shapley["p_adjusted"], np.minimum(len(families) * holm(shapley["p_value"]), 1))
    claims = claims_frame(result)
    assert (claims["p_adjusted"] < 0.05).all() and set(claims["setting"]) >= {"all", *PLANTED}
    alone = analyze(table[table["setting"] == "base"].drop(columns="setting"), FACTORS)
    assert len(result.analyses["base"].claims) <= len(alone.claims)  # a stricter, report-wide bar
    bh = analyze_transfer(table, FACTORS, adjust="bh").guarantee.sentence()
    assert "false discovery rate" in bh and "family-wise" not in bh


def test_transfer_p_interaction_is_welch_on_each_settings_own_estimates(planted_report):
    out, _ = planted_report
    transfer = pd.read_csv(out / "transfer.csv")
    for (statistic, term), rows in list(transfer.groupby(["statistic", "term"]))[:6]:
        expected = welch_heterogeneity(rows["estimate"].to_numpy(), rows["se"].to_numpy(), rows["df"].to_numpy())[3]
        assert rows["p_interaction"].iloc[0] == pytest.approx(expected, rel=1e-12)


def test_one_seed_transfers_only_when_the_noise_allows_the_tost():
    """One seed per cell, three settings, the README's half fraction, the same effects everywhere.
    At run noise like the built-in task's (2 pp: Lenth PSE about 1 pp per effect) no term can
    "transfer" at a 2 pp margin: the widest pair's 90% interval is wider than the margin even around a
    zero difference. That is the noise, not the seed count: with a quarter of the noise the same
    design shows every term within 2 pp, and then it must say "transfers". Either way the verdict is
    the TOST, recomputed here from transfer.csv's own estimate, se and df."""
    same = {("dynamic_sampling",): 0.08, ("clip_higher",): 0.03}
    margin = 0.02
    for noise, expect in ((0.02, "none"), (0.005, "all")):
        table = simulate_settings(FACTORS, 0.40, {s: same for s in ("x", "y", "z")}, rng=0, seeds=1, noise_sd=noise,
                                  cells=HALF)  # fmt: skip
        result = analyze_transfer(table, FACTORS, equivalence_margin=margin)
        assert all(analysis.lenth is not None for analysis in result.analyses.values())  # one seed: Lenth's noise
        verdicts = []
        for (statistic, term), rows in result.transfer.groupby(["statistic", "term"], sort=False):
            far, floor = _equivalence(rows)
            head = rows.iloc[0]
            assert head["excluded_beyond"] == pytest.approx(far)
            assert head["verdict"] not in ("flips sign", "differs in size")  # the effects are equal
            assert (head["verdict"] == "transfers") == (far < margin), (statistic, term, far)
            if expect == "none":
                assert floor > margin, (statistic, term, floor)  # out of reach whatever the estimates
            verdicts.append(head["verdict"])
        assert set(verdicts) == ({"inconclusive"} if expect == "none" else {"transfers"}), (noise, verdicts)
