"""plan-seeds: the power formula against scipy and against simulated reports, and the command."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from dapo_ablate.cli.main import app
from dapo_ablate.reports import PAPER_FACTORS, analyze
from dapo_ablate.reports.power import half_fraction, plan_seeds, power_at
from dapo_ablate.reports.simulate import simulate_results

FACTORS = list(PAPER_FACTORS)


@pytest.mark.parametrize("effect, se, df, level", [(0.02, 0.005, 31, 0.01), (0.02, 0.01, 10, 0.05), (0.01, 0.004, 62, 0.0017)])
def test_power_is_the_noncentral_t_tail(effect, se, df, level):
    critical = stats.t.ppf(1 - level / 2, df)
    expected = stats.nct.sf(critical, df, effect / se) + stats.nct.cdf(-critical, df, effect / se)
    assert power_at(effect, se, df, level) == pytest.approx(expected, abs=1e-8)


def test_plan_by_hand_for_the_interactions_family():
    # full 2^5, n seeds: an interaction effect is c'mu with c = +-1/16 over 32 cells, so
    # SE = sigma sqrt(32 / 256 / n); df = 31 (n - 1); level = .05 / (3 families x 10 tests)
    table = plan_seeds(FACTORS, 0.015, 0.02).set_index(["design", "family"])
    row = table.loc[("full 2^5", "interactions")]
    assert row["tests"] == 10 and row["level"] == pytest.approx(0.05 / 30)
    assert row["se_one_seed"] == pytest.approx(0.015 * np.sqrt(32 / 256))
    n = row["seeds_per_cell"]
    assert power_at(0.02, 0.015 * np.sqrt(1 / 8 / n), 31 * (n - 1), 0.05 / 30) >= 0.8
    assert n == 2 or power_at(0.02, 0.015 * np.sqrt(1 / 8 / (n - 1)), 31 * (n - 2), 0.05 / 30) < 0.8
    assert set(table.index.get_level_values("design")) == {"full 2^5", "half fraction 2^(5-1) (resolution 5)"}
    assert len(half_fraction(5)) == 16


def test_planned_seeds_give_the_planned_power_in_simulated_reports():
    table = plan_seeds(FACTORS, 0.015, 0.02).set_index(["design", "family"])
    row = table.loc[("full 2^5", "attribution")]
    n, planned = int(row["seeds_per_cell"]), row["power"]
    rng = np.random.default_rng(5)
    hits = []
    for _ in range(80):  # OF's Shapley value is 0.02 (a main effect of 2 pp), everything else null
        results = simulate_results(FACTORS, 0.30, {(FACTORS[0],): 0.02}, n, 0.015, 0.01, rng=rng)
        claims = analyze(results, FACTORS).claims
        hits.append(((claims["kind"] == "shapley") & (claims["term"] == FACTORS[0])).any())
    assert abs(np.mean(hits) - planned) < 0.15, (np.mean(hits), planned)  # 80 experiments: sd ~ .045


def test_plan_seeds_command(tmp_path):
    pilot = tmp_path / "pilot.csv"
    simulate_results(FACTORS, 0.30, {}, seeds=3, noise_sd=0.015, seed_sd=0.01, rng=0).to_csv(pilot, index=False)
    result = CliRunner().invoke(app, ["plan-seeds", "--results", str(pilot), "--effect", "0.02"])
    assert result.exit_code == 0, result.output
    assert "pilot's residual (62 df, seeds as blocks)" in result.output and "half fraction 2^(5-1)" in result.output
    stated = CliRunner().invoke(app, ["plan-seeds", "--sd", "0.015", "--factors", "a,b,c", "--effect", "0.02"])
    assert stated.exit_code == 0 and "full 2^3" in stated.output and "resolution 3" in stated.output
    for args, message in (
        (["--sd", "0.015", "--factors", "a,b", "--effect", "-1"], "--effect -1.0 is out of range"),
        (["--sd", "-2", "--factors", "a,b", "--effect", "0.02"], "--sd -2.0 is not a positive number"),
        (["--effect", "0.02"], "give an experiment spec YAML, a pilot --results CSV, or --sd"),
    ):
        bad = CliRunner().invoke(app, ["plan-seeds", *args])
        assert bad.exit_code == 2 and message in bad.output, bad.output
