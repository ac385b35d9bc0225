"""The slower cases of tests/unit/test_transfer_power.py (pilot experiments' ledgers and the ladder
searched): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.app.seeds import SeedsRequest, TransferSeedPlan, plan_seeds
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.results import load_experiment_results
from dapo_ablate.cli.main import app as main_app
from dapo_ablate.reports import transfer_power as tp
from dapo_ablate.reports.power import pilot_sigma
from dapo_ablate.reports.simulate import simulate_settings

from test_transfer_power import FACTORS, NOISE, _pilot_experiment, _test  # noqa: F401, F811 - shared with the fast part


@pytest.mark.parametrize("allocation", [tp.EQUAL, tp.BY_NOISE])
@pytest.mark.parametrize("verdict, size, margin", [(tp.TRANSFERS, 0.0, 0.02), (tp.DIFFERS, 0.04, np.inf)])
def test_the_search_finds_what_a_scan_of_the_ladder_finds(allocation, verdict, size, margin):
    """Three settings, one 3x noisier; the Shapley value (few df): the plan is the first step of the
    allocation's ladder whose power reaches 80%, as a step-by-step scan finds it."""
    planner = tp.Planner(_test("Shapley value"), [0.015, 0.015, 0.045])
    found = tp.seeds_for(planner, verdict, size, margin, 0.8, allocation)
    steps = tp.ladder(planner.sigmas, allocation)
    scanned = next(i for i in range(len(steps)) if planner.power(steps[i], verdict, size, margin) >= 0.8)
    np.testing.assert_array_equal(found.seeds, steps[scanned])
    assert found.power == planner.power(steps[scanned], verdict, size, margin) >= 0.8


def test_a_noisier_setting_costs_runs_and_by_noise_spends_fewer():
    index = ["design", "statistic", "verdict"]
    quiet = tp.plan_transfer(FACTORS[:4], [0.015, 0.015, 0.015], tp.Question(0.04, 0.02)).set_index(index)
    noisy = tp.plan_transfer(FACTORS[:4], [0.015, 0.015, 0.045], tp.Question(0.04, 0.02)).set_index(index)
    assert (noisy["seeds_per_cell"] >= quiet["seeds_per_cell"]).all() and (noisy["power"] >= 0.8).all()
    assert (noisy["by_noise_runs"] <= noisy["runs"]).all() and (noisy["by_noise_power"] >= 0.8).all()
    row = noisy.loc[("full 2^4", "Shapley value", "transfers")]
    seeds = [int(n) for n in row["by_noise"].split(" / ")]
    assert seeds[0] == seeds[1] and 2.5 <= seeds[2] / seeds[0] <= 3.5  # in proportion to the sd
    assert (quiet["power"] == quiet["by_noise_power"]).all()  # equal noise: one allocation


def test_each_settings_noise_is_read_from_a_pilot_experiments_ledger(tmp_path):
    path = _pilot_experiment(tmp_path / "pilot")
    plan = plan_seeds(SeedsRequest(4.0, spec=path))
    assert isinstance(plan, TransferSeedPlan) and [s.name for s in plan.settings] == ["quiet", "noisy"]
    results, factors, *_ = load_experiment_results(load_spec(path))
    for setting in plan.settings:  # each setting's own runs, the single-setting pilot rule
        rows = results[results["setting"] == setting.name].drop(columns="setting")
        assert (setting.sd, setting.source) == pilot_sigma(rows, factors, "avg@32")
        assert setting.sd == pytest.approx(NOISE[setting.name], rel=0.35) and "residual" in setting.source
    assert plan.effect == pytest.approx(0.04) and plan.margin == pytest.approx(0.02)  # typed in pp
    assert plan.table["seeds_per_cell"].notna().all() and (plan.table["power"] >= 0.8).all()
    out = CliRunner().invoke(main_app, ["plan-seeds", str(path), "--effect", "4", "--seeds", "3,6"])
    assert out.exit_code == 0, out.output
    for words in ("Transfer study of 2 settings", "quiet: ", "noisy: ", "residual", "What 3 / 6 seeds per cell (quiet / noisy)",
                  "detectable_difference (pp)", "by_noise"):
        assert words in out.output, (words, out.output)


def test_a_setting_without_runs_in_the_pilot_is_named(tmp_path):
    path = _pilot_experiment(tmp_path / "pilot", only="quiet")
    out = CliRunner().invoke(main_app, ["plan-seeds", str(path), "--effect", "4"])
    assert out.exit_code == 2 and "setting 'noisy' has no finished runs to take its noise from; pass --sd" in out.output
    out = CliRunner().invoke(main_app, ["plan-seeds", str(path), "--effect", "4", "--sd", "1,3"])
    assert out.exit_code == 0 and "noisy: 3 pp from --sd" in out.output, out.output


def test_the_report_leads_with_what_the_study_could_detect_in_every_output(tmp_path):
    """transfer.csv's detectable_difference is transfer_power's, from each setting's own SE and df
    at the report's adjustment; it agrees with what plan-seeds says the same seeds buy; the
    summary's transfer verdicts and report.md open with it, with the same number."""
    from dapo_ablate.reports import ReportOptions
    from dapo_ablate.reports.transfer import analyze_transfer
    from dapo_ablate.reports.transfer_report import write_transfer_report

    planted = {"a": {(FACTORS[4],): 0.08}, "b": {(FACTORS[4],): 0.08}, "c": {(FACTORS[4],): 0.08}}
    table = simulate_settings(FACTORS, 0.3, planted, rng=5, seeds=3, noise_sd=0.015, seed_sd=0.01,
                              noise_sd_by_setting={"c": 0.045})
    result = analyze_transfer(table, FACTORS)
    rows = result.transfer[(result.transfer["statistic"] == "shapley") & (result.transfer["term"] == FACTORS[4])]
    adjustment = tp.Adjustment(20, result.guarantee.n_families)
    expected = tp.detectable_differences(rows["se"].to_numpy()[None], rows["df"].to_numpy()[None], adjustment)[0]
    assert (rows["detectable_difference"] == expected).all()
    planned = tp.detectable(tp.Planner(_test("Shapley value"), [0.015, 0.015, 0.045]), [3, 3, 3], 0.8)[1]
    assert expected == pytest.approx(planned, rel=0.2)  # the estimated SEs scatter around the planned ones
    lines = []
    write_transfer_report(table, FACTORS, tmp_path, ReportOptions(formats=["csv", "md"], echo=lines.append))
    first = lines[lines.index("Transfer verdicts:") + 1]
    assert first.startswith("  - Detectable difference: as run, this study finds a difference between two settings of")
    largest = result.transfer.loc[result.transfer["statistic"] == "shapley", "detectable_difference"].max()
    assert f"to {100 * largest:.1f} pp in a Shapley value" in first
    page = (tmp_path / "report.md").read_text()
    assert first[4:] in page and "detectable_difference" in page.split("Transfer table")[1].splitlines()[2]
    written = pd.read_csv(tmp_path / "transfer.csv")
    assert list(written.columns).index("detectable_difference") == list(written.columns).index("verdict") + 1
