"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_power.py
describes; its docstring says what they check."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from dapo_ablate.reports import analyze
from dapo_ablate.reports.design import describe_design
from dapo_ablate.reports.power import (
    family_contrasts,
    half_fraction,
    plan_seeds,
    power_at,
    welch_df,
)
from dapo_ablate.reports.simulate import simulate_results

from test_power import FACTORS, app  # noqa: F401, F811 - shared with the fast part


def test_plan_is_monotone_in_effect_and_noise_and_reaches_the_power():
    small = plan_seeds(FACTORS, sigma=0.02, effect=0.02)
    large = plan_seeds(FACTORS, sigma=0.02, effect=0.05)
    noisy = plan_seeds(FACTORS, sigma=0.04, effect=0.02)
    assert set(small["family"]) == {"attribution", "interactions", "order"}
    assert (small["power"] >= 0.8).all()
    assert (large["seeds_per_cell"] <= small["seeds_per_cell"]).all()
    assert (noisy["seeds_per_cell"] >= small["seeds_per_cell"]).all()
    # one seed fewer would fall short of the wanted power (the smallest n is reported), on the
    # Welch-Satterthwaite df of the family's least precise statistic
    designs = {32: describe_design(np.arange(32), 5), 16: describe_design(half_fraction(5), 5)}
    for row in small.itertuples():
        m, n = row.cells, row.seeds_per_cell
        contrasts = family_contrasts(designs[m], FACTORS)[row.family][1]
        least = contrasts[np.argmax((contrasts**2).sum(axis=1))]
        if n > 2:
            se = row.se_one_seed / np.sqrt(n - 1)
            assert power_at(0.02, se, welch_df(least, m, n - 1), row.level) < 0.8


def test_cli_from_a_pilot_csv_and_from_a_stated_sd(app, tmp_path):
    path = tmp_path / "pilot.csv"
    simulate_results(FACTORS, 0.3, {}, seeds=2, noise_sd=0.02, rng=1).to_csv(path, index=False)
    out = CliRunner().invoke(app, ["plan-seeds", "--results", str(path), "--effect", "3"])
    assert out.exit_code == 0, out.output
    assert "half fraction" in out.output and "interactions" in out.output and "residual" in out.output
    out = CliRunner().invoke(app, ["plan-seeds", "--sd", "2", "--factors", ",".join(FACTORS), "--effect", "3"])
    assert out.exit_code == 0, out.output and "--sd" in out.output


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


def test_sizes_typed_in_pp_plan_what_the_same_fractions_plan():
    """`--effect 2 --sd 1.5` (pp, as every page shows accuracies) is the plan of 0.02 and 0.015 in
    the stored fractions; the console says pp."""
    from dapo_ablate.cli.main import app as main_app

    out = CliRunner().invoke(main_app, ["plan-seeds", "--sd", "1.5", "--factors", "a,b,c", "--effect", "2"])
    assert out.exit_code == 0, out.output
    assert "size 2 pp (avg@32)" in out.output and "run noise sd 1.5 pp" in out.output
    expected = plan_seeds(["a", "b", "c"], 0.015, 0.02)
    shown = CliRunner().invoke(main_app, ["plan-seeds", "--sd", "1.5", "--factors", "a,b,c", "--effect", "2"]).output
    assert expected.to_string(index=False, float_format=lambda v: f"{v:.3g}") in shown
