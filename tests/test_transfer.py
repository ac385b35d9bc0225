"""Transfer studies in the reports: planted effects across settings through `dapo-ablate report
--results`, the interaction test against a dense OLS, Cochran's Q by hand, bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import typer
from scipy import stats
from typer.testing import CliRunner

from dapo_ablate.cli.report_cmd import register
from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports.claims import CLAIM_COLUMNS
from dapo_ablate.reports.simulate import simulate_settings
from dapo_ablate.reports.transfer import VERDICTS, analyze_transfer, cochran_q, verdict
from dapo_ablate.reports.transfer_report import write_transfer_report

FACTORS = list(PAPER_FACTORS)
EQUAL_DS = ("dynamic_sampling",), 0.08
PLANTED = {  # clip_higher flips sign in "base"; dynamic_sampling is the same everywhere
    "instruct": {("clip_higher",): 0.06, EQUAL_DS[0]: EQUAL_DS[1]},
    "short": {("clip_higher",): 0.06, EQUAL_DS[0]: EQUAL_DS[1]},
    "base": {("clip_higher",): -0.06, EQUAL_DS[0]: EQUAL_DS[1]},
}
TABLES = ("cells", "cumulative", "orderings", "shapley", "effects", "leave_one_out", "compute", "compute_matched")


@pytest.fixture()
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop", hidden=True)
    def noop() -> None:
        pass

    return app


@pytest.fixture(scope="module")
def planted_report(tmp_path_factory):
    """The CLI on a three-setting, three-seed results CSV; returns (out dir, CLI output)."""
    folder = tmp_path_factory.mktemp("transfer")
    table = simulate_settings(FACTORS, 0.30, PLANTED, rng=1, seeds=3, noise_sd=0.015, seed_sd=0.01)
    table.to_csv(folder / "results.csv", index=False)
    app = typer.Typer()
    register(app)
    app.command("noop", hidden=True)(lambda: None)
    result = CliRunner().invoke(app, ["report", "--results", str(folder / "results.csv"), "--out", str(folder / "out")])
    assert result.exit_code == 0, result.output
    return folder / "out", result.output


def test_flipped_effect_is_flips_sign_and_significant_after_adjustment(planted_report):
    out, _ = planted_report
    transfer = pd.read_csv(out / "transfer.csv")
    for statistic in ("main", "shapley"):
        rows = transfer[(transfer["statistic"] == statistic) & (transfer["term"] == "clip_higher")]
        assert len(rows) == 3 and set(rows["setting"]) == set(PLANTED)
        assert set(rows["verdict"]) == {"flips sign"}
        assert (rows["p_adjusted"] < 0.05).all() and (rows["p_adjusted"] >= rows["p_interaction"]).all()
        base = rows.set_index("setting").loc["base"]
        assert base["ci_high"] < 0 < rows.set_index("setting").loc["short", "ci_low"]


def test_equal_effect_transfers(planted_report):
    out, _ = planted_report
    transfer = pd.read_csv(out / "transfer.csv")
    rows = transfer[(transfer["term"] == "dynamic_sampling") & transfer["statistic"].isin(["main", "shapley"])]
    assert set(rows["verdict"]) == {"transfers"}
    assert (rows["p_adjusted"] >= 0.05).all()
    assert rows["estimate"].between(0.06, 0.10).all()  # each setting recovers the planted +8 pp


def test_transfer_csv_contract_and_tables_per_setting(planted_report):
    out, output = planted_report
    transfer = pd.read_csv(out / "transfer.csv")
    for column in ("term", "setting", "estimate", "ci_low", "ci_high", "p_interaction", "p_adjusted", "q", "i2", "verdict"):
        assert column in transfer.columns
    assert set(transfer["verdict"]) <= set(VERDICTS)
    assert not transfer.duplicated(["statistic", "term", "setting"]).any()
    per_term = transfer.groupby(["statistic", "term"])
    assert (per_term["setting"].count() == 3).all()
    for column in ("p_interaction", "p_adjusted", "q", "i2", "verdict"):
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
    assert any(t.startswith("shapley clip_higher") for t in across["term"])
    assert not any("dynamic_sampling" in t for t in across["term"])
    ranks = pd.read_csv(out / "rank_agreement.csv")
    assert len(ranks) == 3 and ranks["kendall_tau"].between(-1, 1).all()
    assert (out / "transfer.png").read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.md").read_text()
    for line in across.itertuples():
        assert "differs between settings" in report
    assert "flips sign" in report and "# Setting base" in report
    assert "Supported by the data" in output


def _dense_interaction_p(table: pd.DataFrame, factors: list[str], term: str) -> float:
    """Wald F of 'main effect of ``term`` equal in every setting' from a dense OLS with one
    coefficient per (setting, cell) and seed dummies within setting (first seed of each dropped)."""
    masks = table[factors].to_numpy() @ (1 << np.arange(len(factors)))
    keys = list(zip(table["setting"], masks))
    cells = sorted(set(keys))
    seeds = sorted({(s, d) for s, d in zip(table["setting"], table["seed"])})
    first = {s: min(d for t, d in seeds if t == s) for s, _ in seeds}
    seed_cols = [(s, d) for s, d in seeds if d != first[s]]
    x = np.zeros((len(table), len(cells) + len(seed_cols)))
    for i, (key, s, d) in enumerate(zip(keys, table["setting"], table["seed"])):
        x[i, cells.index(key)] = 1
        if (s, d) in seed_cols:
            x[i, len(cells) + seed_cols.index((s, d))] = 1
    y = table["avg@32"].to_numpy()
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    df = len(y) - np.linalg.matrix_rank(x)
    sigma2 = float(np.sum((y - x @ beta) ** 2) / df)
    settings = list(dict.fromkeys(table["setting"]))
    i = factors.index(term)
    rows = []
    for s in settings:  # main effect in setting s: mean(on) - mean(off) over its cells
        c = np.zeros(x.shape[1])
        for j, (t, mask) in enumerate(cells):
            if t == s:
                c[j] = (1 if mask >> i & 1 else -1) / (2 ** (len(factors) - 1))
        rows.append(c)
    d = np.array(rows[:-1]) - rows[-1]
    diff = d @ beta
    f = diff @ np.linalg.inv(d @ np.linalg.pinv(x.T @ x) @ d.T) @ diff / (len(d) * sigma2)
    return float(stats.f.sf(f, len(d), df))


@pytest.mark.parametrize("drop_run", [False, True])
def test_interaction_test_equals_dense_ols(drop_run):
    factors = ["a", "b", "c"]
    planted = {"s1": {("a",): 0.05}, "s2": {("a",): 0.02}, "s3": {("a",): 0.04, ("b",): 0.03}}
    table = simulate_settings(factors, 0.4, planted, rng=3, seeds=3, noise_sd=0.02, seed_sd=0.02)
    if drop_run:  # a missing run: unbalanced, the within-seed form must still be exact
        table = table.drop(index=5).reset_index(drop=True)
    result = analyze_transfer(table, factors).transfer
    ours = result[(result["statistic"] == "main") & (result["term"] == "a")]["p_interaction"].iloc[0]
    assert ours == pytest.approx(_dense_interaction_p(table, factors, "a"), rel=1e-6)


def test_cochran_q_and_verdict_by_hand():
    # estimates (1, 3), se (1, 1): pooled 2, Q = 1 + 1 = 2, I^2 = (2 - 1) / 2 = 0.5
    q, i2 = cochran_q(np.array([1.0, 3.0]), np.array([1.0, 1.0]))
    assert (q, i2) == pytest.approx((2.0, 0.5))
    assert cochran_q(np.array([1.0, 1.1]), np.array([1.0, 1.0]))[1] == 0.0  # Q < S - 1: no excess spread
    low, high = np.array([0.1, -0.5]), np.array([0.3, -0.2])
    assert verdict(low, high, 0.001, 0.05) == "flips sign"
    assert verdict(np.array([0.1, 0.4]), np.array([0.3, 0.6]), 0.001, 0.05) == "differs in size"
    assert verdict(np.array([-0.1, 0.0]), np.array([0.3, 0.4]), 0.4, 0.05) == "transfers"
    assert verdict(low, high, 0.2, 0.05) == "not enough data"  # opposite sides, test cannot confirm
    assert verdict(low, high, float("nan"), 0.05) == "not enough data"


def test_no_heterogeneity_claims_none():
    factors = ["a", "b", "c", "d"]
    same = {("a",): 0.05, ("b",): -0.03, ("a", "b"): 0.02}
    table = simulate_settings(factors, 0.3, {"x": same, "y": same, "z": same}, rng=7, seeds=3, noise_sd=0.02)
    result = analyze_transfer(table, factors)
    assert result.claims.empty
    assert set(result.transfer["verdict"]) <= {"transfers", "not enough data"}


def test_one_seed_uses_pooled_lenth_and_still_judges(tmp_path):
    factors = ["a", "b", "c", "d"]
    planted = {"x": {("a",): 0.1}, "y": {("a",): 0.1}, "z": {("a",): -0.1}}
    table = simulate_settings(factors, 0.3, planted, rng=2, seeds=1, noise_sd=0.005)
    result = analyze_transfer(table, factors)
    assert result.noise_method == "lenth"
    rows = result.transfer[(result.transfer["statistic"] == "main") & (result.transfer["term"] == "a")]
    assert set(rows["verdict"]) == {"flips sign"}
    written = write_transfer_report(
        table, factors, tmp_path, {"csv", "md"}, metric="avg@32", orderings="paper", confidence=0.95,
        design=None, adjust="holm", per_effect_tests=False,
    )  # fmt: skip
    assert "Lenth" in written["report.md"].read_text()


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda t: t.assign(setting=t["setting"].where(t.index != 4, "")), ["setting", "empty", "data row 5"]),
        (lambda t: pd.concat([t, t.iloc[[0]]], ignore_index=True), ["more than one row", "setting 'x'"]),
        (lambda t: t.assign(**{"avg@32": t["avg@32"].where(t["setting"] != "y", np.nan)}), ["setting 'y'", "avg@32"]),
    ],
)
def test_bad_transfer_input_exits_2_with_one_sentence(app, tmp_path, change, words):
    table = simulate_settings(["a", "b"], 0.3, {"x": {}, "y": {}}, rng=0, seeds=2)
    path = tmp_path / "results.csv"
    change(table).to_csv(path, index=False)
    result = CliRunner().invoke(app, ["report", "--results", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert all(w in result.output for w in words), result.output
    assert not (tmp_path / "out").exists()
