"""Transfer studies in the reports: planted effects across settings through `dapo-ablate report
--results`; each setting keeps its own noise (never pooled); Welch's heterogeneity test against
statsmodels; "flips sign" only on simultaneous intervals; "transfers" only under the equivalence
margin; one error guarantee over the whole claims.csv; bad input."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd
import pytest
import typer
from scipy import stats
from statsmodels.stats.oneway import anova_oneway
from typer.testing import CliRunner

from dapo_ablate.cli.report_cmd import register
from dapo_ablate.reports import PAPER_FACTORS, analyze
from dapo_ablate.reports.heterogeneity import (
    cochran_q,
    excluded_beyond,
    flip_p,
    pair_difference,
    welch_heterogeneity,
)
from dapo_ablate.reports.simulate import simulate_settings
from dapo_ablate.reports.transfer import analyze_transfer

FACTORS = list(PAPER_FACTORS)
OF, CH, SP, TL, DS = FACTORS
HALF = [m for m in range(32) if bin(m).count("1") % 2 == 0]  # the README's resolution V half fraction
EQUAL_DS = ("dynamic_sampling",), 0.08
PLANTED = {  # clip_higher flips sign in "base"; dynamic_sampling is the same everywhere
    "instruct": {("clip_higher",): 0.06, EQUAL_DS[0]: EQUAL_DS[1]},
    "short": {("clip_higher",): 0.06, EQUAL_DS[0]: EQUAL_DS[1]},
    "base": {("clip_higher",): -0.06, EQUAL_DS[0]: EQUAL_DS[1]},
}
TABLES = ("cells", "cumulative", "orderings", "shapley", "effects", "leave_one_out", "compute", "compute_matched")


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    app.command("noop", hidden=True)(lambda: None)  # a second command keeps `report` a named subcommand
    return app


@pytest.fixture(scope="module")
def planted_report(tmp_path_factory):
    """The CLI on a three-setting, three-seed results CSV; returns (out dir, CLI output)."""
    folder = tmp_path_factory.mktemp("transfer")
    table = simulate_settings(FACTORS, 0.30, PLANTED, rng=1, seeds=3, noise_sd=0.015, seed_sd=0.01)
    table.to_csv(folder / "results.csv", index=False)
    args = ["report", "--results", str(folder / "results.csv"), "--out", str(folder / "out")]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    return folder / "out", result.output


def _term(transfer: pd.DataFrame, statistic: str, term: str) -> pd.DataFrame:
    return transfer[(transfer["statistic"] == statistic) & (transfer["term"] == term)].set_index("setting")


def test_a_setting_keeps_its_own_variance_whatever_the_others_noise():
    """Fails if any variance is pooled over settings: making one setting 5x noisier (accuracies stay in [0, 1]) must leave
    every number of the others unchanged, and each equals that setting analysed alone."""
    same = {("a",): 0.05, ("b",): -0.03}
    planted = {"x": same, "y": same, "z": same}
    quiet = simulate_settings(["a", "b", "c"], 0.4, planted, rng=4, seeds=3, noise_sd=0.01, seed_sd=0.01)
    noisy = quiet.copy()
    z = noisy["setting"] == "z"
    noisy.loc[z, "avg@32"] = 0.4 + 5 * (noisy.loc[z, "avg@32"] - 0.4)
    first, second = analyze_transfer(quiet, ["a", "b", "c"]).transfer, analyze_transfer(noisy, ["a", "b", "c"]).transfer
    for column in ("estimate", "se", "df", "ci_low", "ci_high"):
        np.testing.assert_allclose(first.loc[first["setting"] != "z", column], second.loc[second["setting"] != "z", column])
    alone = analyze(quiet[quiet["setting"] == "x"].drop(columns="setting"), ["a", "b", "c"])
    rows = first[(first["setting"] == "x") & (first["statistic"] == "main")].set_index("term")
    effects = alone.effects.set_index("term")
    np.testing.assert_allclose(rows["se"], effects.loc[rows.index, "se"])
    np.testing.assert_allclose(rows["ci_high"], effects.loc[rows.index, "ci_high"])


def test_a_setting_without_a_noise_estimate_is_not_enough_data():
    """One seed in an incomplete design: no residual df and no Lenth; the setting must not borrow
    the other settings' variance, so every term it enters is "not enough data"."""
    factors = ["a", "b", "c"]
    table = simulate_settings(factors, 0.4, {"x": {("a",): 0.05}, "y": {("a",): 0.05}}, rng=5, seeds=3)
    lone = simulate_settings(factors, 0.4, {"z": {("a",): 0.05}}, rng=6, seeds=1, cells=list(range(7)))
    result = analyze_transfer(pd.concat([table, lone], ignore_index=True), factors)
    main = result.transfer[result.transfer["statistic"] == "main"]
    assert main.loc[main["setting"] == "z", "se"].isna().all() and main.loc[main["setting"] == "z", "estimate"].notna().all()
    assert set(main["verdict"]) == {"not enough data"} and main["p_adjusted"].isna().all()


def test_welch_heterogeneity_equals_statsmodels_and_by_hand():
    rng = np.random.default_rng(1)
    groups = [rng.normal(0, sd, n) for sd, n in ((1, 5), (3, 8), (0.5, 4))]
    theta = np.array([g.mean() for g in groups])
    se = np.array([g.std(ddof=1) / np.sqrt(len(g)) for g in groups])
    f, df1, df2, p = welch_heterogeneity(theta, se, np.array([len(g) - 1 for g in groups]))
    reference = anova_oneway(groups, use_var="unequal")
    assert (f, df2, p) == pytest.approx((reference.statistic, reference.df[1], reference.pvalue), rel=1e-10)
    assert df1 == 2
    # two settings: theta (0, 2), se (1, 1), df (10, 10) -> F = 2 on (1, 20), Welch's t^2
    f, df1, df2, p = welch_heterogeneity(np.array([0.0, 2.0]), np.ones(2), np.array([10.0, 10.0]))
    assert (f, df1, df2) == pytest.approx((2.0, 1.0, 20.0)) and p == pytest.approx(stats.f.sf(2, 1, 20))


def test_across_settings_formulas_by_hand():
    # estimates (1, 3), se (1, 1): pooled 2, Q = 1 + 1 = 2, I^2 = (2 - 1) / 2 = 0.5
    q, i2 = cochran_q(np.array([1.0, 3.0]), np.array([1.0, 1.0]))
    assert (q, i2) == pytest.approx((2.0, 0.5))
    assert cochran_q(np.array([1.0, 1.1]), np.array([1.0, 1.0]))[1] == 0.0  # Q < S - 1: no excess spread
    # flip: the positive setting with the smallest p (.001, setting 0) and the negative one (.02, setting 1)
    assert flip_p(np.array([0.05, -0.03, 0.01]), np.array([0.001, 0.02, 0.6])) == (0.02, 0, 1)
    assert flip_p(np.array([0.05, 0.03]), np.array([0.001, 0.02]))[0] == 1.0  # one sign: nothing to flip
    # se (.3, .4), df (10, 20): SE .5, df .5^4 / (.3^4 / 10 + .4^4 / 20) = .0625 / .00209 = 29.9
    d, se, df = pair_difference(np.array([1.0, 0.2]), np.array([0.3, 0.4]), np.array([10.0, 20.0]), 0, 1)
    assert (d, se, df) == pytest.approx((0.8, 0.5, 0.0625 / (0.3**4 / 10 + 0.4**4 / 20)))
    # theta (0, .01), se (.005, .005), infinite df: |d| + z_.95 sqrt(2) .005 = .01 + 1.645 x .00707 = .0216
    far = excluded_beyond(np.array([0.0, 0.01]), np.array([0.005, 0.005]), np.array([np.inf, np.inf]), 0.05)
    assert far == pytest.approx(0.01 + stats.norm.ppf(0.95) * np.sqrt(2) * 0.005)


def test_no_heterogeneity_claims_none():
    factors = ["a", "b", "c", "d"]
    same = {("a",): 0.05, ("b",): -0.03, ("a", "b"): 0.02}
    table = simulate_settings(factors, 0.3, {"x": same, "y": same, "z": same}, rng=7, seeds=3, noise_sd=0.02)
    result = analyze_transfer(table, factors)
    assert result.claims.empty
    assert set(result.transfer["verdict"]) <= {"transfers", "inconclusive"}


def test_planted_flip_and_constant_effect_on_the_readme_design_with_three_seeds():
    """The README's transfer design (resolution V half fraction, 3 settings) with 3 seeds."""
    table = simulate_settings(FACTORS, 0.30, PLANTED, rng=3, seeds=3, noise_sd=0.015, seed_sd=0.01, cells=HALF)
    transfer = analyze_transfer(table, FACTORS).transfer
    assert set(_term(transfer, "shapley", CH)["verdict"]) == {"flips sign"}
    assert set(_term(transfer, "shapley", DS)["verdict"]) == {"transfers"}


def _equivalence(rows: pd.DataFrame, alpha: float = 0.05) -> tuple[float, float]:
    """(the far end of the widest pair's (1 - 2 alpha) interval, its half-width alone) of one term,
    recomputed from its transfer.csv rows (estimate, se, df per setting): two independent settings'
    difference on its Welch-Satterthwaite df. A term "transfers" at margin M exactly when every pair's
    interval lies inside (-M, M), i.e. when the first number is below M; the second is what even a
    zero difference would need."""
    ends, halves = [], []
    for (_, a), (_, b) in combinations(rows.iterrows(), 2):
        var = a["se"] ** 2 + b["se"] ** 2
        df = var**2 / (a["se"] ** 4 / a["df"] + b["se"] ** 4 / b["df"])
        half = stats.t.ppf(1 - alpha, df) * np.sqrt(var)
        ends.append(abs(a["estimate"] - b["estimate"]) + half)
        halves.append(half)
    return max(ends), max(halves)


@pytest.mark.parametrize(
    "change, extra, words",
    [
        (lambda t: t.assign(setting=t["setting"].where(t.index != 4, "")), [], ["setting", "empty", "data row 5"]),
        (lambda t: pd.concat([t, t.iloc[[0]]], ignore_index=True), [], ["more than one row", "setting 'x'"]),
        (lambda t: t.assign(**{"avg@32": t["avg@32"].where(t["setting"] != "y", np.nan)}), [], ["setting 'y'", "avg@32"]),
        (lambda t: t, ["--equivalence-margin", "0.02"], ["--equivalence-margin 0.02", "for 2 pp write --equivalence-margin 2"]),
    ],
)
def test_bad_transfer_input_exits_2_with_one_sentence(tmp_path, change, extra, words):
    table = simulate_settings(["a", "b"], 0.3, {"x": {}, "y": {}}, rng=0, seeds=2)
    path = tmp_path / "results.csv"
    change(table).to_csv(path, index=False)
    result = CliRunner().invoke(_app(), ["report", "--results", str(path), "--out", str(tmp_path / "out"), *extra])
    assert result.exit_code == 2, result.output
    assert all(w in result.output for w in words), result.output
    assert not (tmp_path / "out").exists()
