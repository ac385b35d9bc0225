"""`dapo-ablate plan-seeds` and reports.power: seeds per cell for a wanted power, per claims family.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_power_e2e.py."""

from __future__ import annotations

import numpy as np
import pytest
import typer
from scipy import stats
from typer.testing import CliRunner

from dapo_ablate.cli.plan_seeds_cmd import register
from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports.power import (
    half_fraction,
    pilot_sigma,
    plan_seeds,
    power_at,
    welch_df,
)
from dapo_ablate.reports.simulate import simulate_results

FACTORS = list(PAPER_FACTORS)


@pytest.fixture()
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop", hidden=True)  # a second command keeps `plan-seeds` a named subcommand
    def noop() -> None:
        pass

    return app


def test_power_at_matches_the_normal_formula_for_large_df_and_a_simulation_for_small_df():
    # Large df: power ~ Phi(delta - z) + Phi(-delta - z); delta = 2.8, z = 1.96 -> 0.80 (textbook).
    assert power_at(2.8, 1.0, 10_000, 0.05) == pytest.approx(0.80, abs=0.005)
    # Small df: a Monte Carlo of the t test itself (T = (effect + se Z) / (se s), s^2 ~ chi2(df)/df).
    rng = np.random.default_rng(0)
    df, effect, se, level = 4, 1.5, 0.5, 0.01
    t_stat = (effect + se * rng.standard_normal(400_000)) / (se * np.sqrt(rng.chisquare(df, 400_000) / df))
    simulated = np.mean(np.abs(t_stat) > stats.t.ppf(1 - level / 2, df))
    assert power_at(effect, se, df, level) == pytest.approx(simulated, abs=0.004)


def test_half_fraction_has_an_even_number_of_factors_on():
    cells = half_fraction(5)
    assert len(cells) == 16 and all(bin(m).count("1") % 2 == 0 for m in cells)


def test_pilot_sigma_recovers_the_run_noise_with_seed_blocks():
    pilot = simulate_results(FACTORS, 0.3, {("dynamic_sampling",): 0.05}, seeds=4, noise_sd=0.02, seed_sd=0.05, rng=3)
    sigma, source = pilot_sigma(pilot, FACTORS, "avg@32")
    assert sigma == pytest.approx(0.02, rel=0.15)
    assert "blocks" in source


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sd", "2", "--effect", "2"], "--factors"),
        (["--sd", "-1", "--factors", "a,b,c", "--effect", "2"], "--sd"),
        (["--sd", "2", "--factors", "a,b,c", "--effect", "0"], "--effect"),
        (["--sd", "2", "--factors", "a,b,c", "--effect", "2", "--adjust", "bonf"], "--adjust"),
        (["--effect", "2"], "spec YAML"),
        (["--sd", "2", "--factors", "a,b,c", "--effect", "0.02"], "for 2 pp write --effect 2"),  # a fraction typed
        (["--sd", "0.015", "--factors", "a,b,c", "--effect", "2"], "for 1.5 pp write --sd 1.5"),
        (["--sd", "2", "--factors", "a,b,c", "--effect", "200"], "cannot exceed 100"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(app, args, message):
    out = CliRunner().invoke(app, ["plan-seeds", *args])
    assert out.exit_code == 2
    assert message in out.output and "Traceback" not in out.output


@pytest.mark.parametrize("effect, se, df, level", [(0.02, 0.005, 31, 0.01), (0.02, 0.01, 10, 0.05), (0.01, 0.004, 62, 0.0017)])
def test_power_is_the_noncentral_t_tail(effect, se, df, level):
    critical = stats.t.ppf(1 - level / 2, df)
    expected = stats.nct.sf(critical, df, effect / se) + stats.nct.cdf(-critical, df, effect / se)
    assert power_at(effect, se, df, level) == pytest.approx(expected, abs=1e-8)


def test_welch_df_by_hand():
    # an effect of the 2^5 (c = +-1/16 over 32 cells), 3 seeds: 32 x 2 x 31 / 32 = 62, the residual df;
    # one cell against another, 3 seeds: (2)^2 / 2 x 2 x 31 / 32 = 3.875
    assert welch_df(np.full(32, 1 / 16), 32, 3) == pytest.approx(62)
    assert welch_df(np.array([1.0, -1.0] + [0.0] * 30), 32, 3) == pytest.approx(3.875)


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


def test_plan_seeds_is_a_command_of_the_app():
    from dapo_ablate.cli.main import app as main_app

    out = CliRunner().invoke(main_app, ["plan-seeds", "--sd", "1.5", "--factors", "a,b,c", "--effect", "2"])
    assert out.exit_code == 0 and "full 2^3" in out.output and "resolution 3" in out.output, out.output
