"""`plan-seeds` for a transfer study (reports.transfer_power, ablation.app.seeds): seeds per cell for
the transfer report's "transfers" and "differs" verdicts from each setting's own noise, and what
given seeds buy.

- the planned power agrees with the textbook closed forms where they hold (two settings, many
  df: the TOST's 2 Phi(M / se_d - z) - 1 and the two-sided test's Phi(D / se_d - z)), and the
  planned seeds with the closed form's smallest n;
- the search returns what a brute-force scan of the same power returns, for both allocations;
- the planning uses the report's own rule: the vectorised verdict and formulas equal the scalar
  ones the report applies term by term;
- each setting's noise is read from a pilot experiment's ledger, setting by setting;
- bad input is one sentence naming the flag and the fix, exit 2.

The simulation that checks the planned powers against simulated transfer reports is
benchmarks/transfer_plan_sim.py (benchmarks/README.md, "Planning a transfer study")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.cli.main import app as main_app
from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports import transfer_power as tp
from dapo_ablate.reports.heterogeneity import (
    excluded_beyond,
    excluded_beyond_many,
    flip_p,
    flip_p_many,
    verdicts_of,
    welch_heterogeneity,
    welch_heterogeneity_many,
)
from dapo_ablate.reports.simulate import simulate_settings
from dapo_ablate.reports.transfer import _verdict

from support import write_spec

FACTORS = list(PAPER_FACTORS)


def _test(statistic: str = "main or interaction effect", design: str = "full") -> tp.TransferTest:
    return next(t for t in tp.transfer_tests(FACTORS) if t.design.startswith(design) and statistic in t.statistic)


def test_transfer_tests_are_the_reports_terms_and_families():
    """A full 2^5 transfer report judges 5 main effects, 5 Shapley values and 10 interactions in
    five families (attribution, interactions, order, transfer, flips)."""
    full = [t for t in tp.transfer_tests(FACTORS) if t.design == "full 2^5"]
    assert [t.statistic for t in full] == ["Shapley value", "main or interaction effect"]
    assert all(t.terms == 20 and t.families == 5 and t.cells == 32 for t in full)
    assert np.sum(full[1].contrast**2) == pytest.approx(32 / 16**2)  # an effect: +-1/16 over 32 cells
    half = [t for t in tp.transfer_tests(FACTORS) if t.design.startswith("half")]
    assert len(half) == 1 and half[0].statistic == "Shapley value, main or interaction effect"  # one precision


def test_transfers_power_and_seeds_match_the_closed_form_with_many_df():
    """Two settings, sd 6 pp, margin 2 pp, a main effect of the 2^5 (c'c = 1/8): with n seeds the
    difference has se_d = sqrt(2 x 36 / 8 / n) pp, and on many df the TOST's power is
    2 Phi(M / se_d - z_.95) - 1, so n = ceil(9 (z_.95 + z_.9)^2 / 4) = 20 reaches 80%."""
    test, sigmas = _test(), [0.06, 0.06]
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.9)
    closed_n = int(np.ceil(2 * 0.06**2 / 8 * z**2 / 0.02**2))
    assert closed_n == 20
    planner = tp.Planner(test, sigmas)
    for n in (12, closed_n, 30):
        se_d = np.sqrt(2 * 0.06**2 / 8 / n)
        closed = 2 * stats.norm.cdf(0.02 / se_d - stats.norm.ppf(0.95)) - 1
        assert planner.power([n, n], tp.TRANSFERS, 0.0, 0.02) == pytest.approx(closed, abs=0.015), n
    found = tp.seeds_for(planner, tp.TRANSFERS, 0.0, 0.02, 0.8, tp.EQUAL)
    assert abs(int(found.seeds[0]) - closed_n) <= 1 and found.power >= 0.8


def test_differs_power_and_seeds_match_the_closed_form_with_many_df():
    """Two settings 2 pp apart, sd 4 pp: Welch's test of two settings is the two-sided t test at
    the report's level alpha / (5 families x 20 terms) = .0005, so on many df the power is
    Phi(D / se_d - z_{1 - .00025}) (+ the far tail) and n = ceil(2 x 16 / 8 (z + z_.8)^2 / 4)."""
    test, sigmas = _test(), [0.04, 0.04]
    level = 0.05 / (5 * 20)
    z = stats.norm.ppf(1 - level / 2)
    closed_n = int(np.ceil(2 * 0.04**2 / 8 * (z + stats.norm.ppf(0.8)) ** 2 / 0.02**2))
    planner = tp.Planner(test, sigmas)
    for n in (closed_n - 4, closed_n):
        shift = 0.02 / np.sqrt(2 * 0.04**2 / 8 / n)
        closed = stats.norm.cdf(shift - z) + stats.norm.cdf(-shift - z)
        assert planner.power([n, n], tp.DIFFERS, 0.02, np.inf) == pytest.approx(closed, abs=0.015), n
    found = tp.seeds_for(planner, tp.DIFFERS, 0.02, np.inf, 0.8, tp.EQUAL)
    assert abs(int(found.seeds[0]) - closed_n) <= 1


def test_first_reaching_from_every_start():
    for count in (1, 2, 7, 40):
        for answer in range(count + 1):
            for start in range(count):
                assert tp.first_reaching(count, lambda i: i >= answer, start) == answer


def test_ladders_equal_and_by_noise():
    equal = tp.ladder([0.01, 0.03], tp.EQUAL)
    assert equal[0].tolist() == [2, 2] and equal[-1].tolist() == [1000, 1000]
    steps = tp.ladder([0.01, 0.01, 0.03], tp.BY_NOISE)
    assert (np.diff(steps, axis=0) >= 0).all() and (np.diff(steps.sum(axis=1)) > 0).all()  # each step adds, none removes
    assert steps[0].tolist() == [2, 2, 2] and [3, 3, 9] in steps.tolist() and [10, 10, 30] in steps.tolist()
    assert steps.max() <= 1000


def test_what_a_budget_buys_is_reached_at_the_power():
    """detectable: the smallest margin and difference with 80% power for 3 seeds in every setting;
    the same simulated reports give 80% there and less just below."""
    planner = tp.Planner(_test("Shapley value"), [0.015, 0.015, 0.045])
    margin, difference = tp.detectable(planner, [3, 3, 3], 0.8)
    assert planner.power([3, 3, 3], tp.TRANSFERS, 0.0, margin) >= 0.8 > planner.power([3, 3, 3], tp.TRANSFERS, 0.0, margin * 0.99)
    assert planner.power([3, 3, 3], tp.DIFFERS, difference, np.inf) >= 0.8
    assert planner.power([3, 3, 3], tp.DIFFERS, difference * 0.98, np.inf) < 0.8
    more, _ = tp.detectable(planner, [6, 6, 6], 0.8)
    assert more < margin  # more seeds buy a narrower margin


def test_the_plan_is_the_same_every_time():
    first = tp.plan_transfer(FACTORS[:2], [0.01, 0.02], tp.Question(0.03, 0.02))
    pd.testing.assert_frame_equal(first, tp.plan_transfer(FACTORS[:2], [0.01, 0.02], tp.Question(0.03, 0.02)))


def test_vectorised_formulas_and_rule_equal_the_reports_scalar_ones():
    rng = np.random.default_rng(4)
    theta, se = rng.normal(0, 0.02, (200, 3)), rng.uniform(0.002, 0.02, (200, 3))
    df = rng.uniform(2, 60, (200, 3))
    df[:5, 0] = np.inf
    se[5, 1], theta[6, 2] = 0.0, np.nan  # unusable terms: NaN both ways
    with np.errstate(divide="ignore", invalid="ignore"):
        p_each = 2 * stats.t.sf(np.abs(theta) / se, df)
    many = welch_heterogeneity_many(theta, se, df)[3], excluded_beyond_many(theta, se, df, 0.05), flip_p_many(theta, p_each)
    for i in range(200):
        one = welch_heterogeneity(theta[i], se[i], df[i])[3], excluded_beyond(theta[i], se[i], df[i], 0.05), flip_p(theta[i], p_each[i])[0]
        for vector, scalar in zip(many, one):
            assert vector[i] == pytest.approx(scalar, rel=1e-12, nan_ok=True)
    flips, p_adj, far = rng.uniform(0, 0.1, 200), rng.uniform(0, 0.1, 200), rng.uniform(0, 0.04, 200)
    complete = rng.uniform(size=200) > 0.1
    words = verdicts_of(complete, flips, p_adj, far, 0.02, 0.05)

    class Values:
        def __init__(self, ok):
            self.complete = ok

    assert [str(w) for w in words] == [_verdict(Values(c), f, p, d, 0.02, 0.05) for c, f, p, d in zip(complete, flips, p_adj, far)]


SETTINGS = [{"name": "quiet", "overrides": {"optim.lr": 1.0e-6}}, {"name": "noisy", "overrides": {"optim.lr": 1.0e-5}}]
NOISE = {"quiet": 0.01, "noisy": 0.03}


def _pilot_experiment(folder: Path, only: str | None = None) -> Path:
    """A two-setting pilot (factors OF, CH, SP; 3 seeds) whose runs are recorded done in its ledger,
    each setting's avg@32 with its own run noise (NOISE) and seed effects, as `run` leaves them
    (``only``: that setting's runs only)."""
    from dapo_ablate.ablation.store.binding import experiment_digest
    from dapo_ablate.ablation.store.ledger import SQLLedger

    path = write_spec(folder, factors=FACTORS[:3], settings=SETTINGS, seeds=3)
    spec = load_spec(path)
    plan, rng = expand(spec), np.random.default_rng(0)
    seed_effect = {(s, seed): rng.normal(0, 0.01) for s in NOISE for seed in range(3)}
    Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict(), digest=experiment_digest(spec))
        ledger.add_runs(spec.name, plan.run_specs())
        for run in plan.runs:
            if only not in (None, run.setting):
                continue
            assert ledger.claim(run.run_id, "h")
            value = 0.3 + 0.05 * run.factors["clip_higher"] + seed_effect[(run.setting, run.seed)]
            value += rng.normal(0, NOISE[run.setting])
            ledger.finish(run.run_id, {"metrics": {"avg@32": value}, "tokens_generated": 1, "tokens_discarded": 0, "wall_s": 1.0})
    return path


def test_a_pilot_csv_with_settings_plans_the_transfer_study(tmp_path):
    path = tmp_path / "pilot.csv"
    simulate_settings(FACTORS[:3], 0.3, {"a": {}, "b": {}}, rng=1, seeds=2, noise_sd=0.02).to_csv(path, index=False)
    out = CliRunner().invoke(main_app, ["plan-seeds", "--results", str(path), "--effect", "5", "--equivalence-margin", "3"])
    assert out.exit_code == 0, out.output
    assert "Transfer study of 2 settings" in out.output and "within --equivalence-margin 3 pp" in out.output
    assert "by_noise" not in out.output or "a / b" in out.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--settings", "a,b", "--sd", "1.5,2,3"], ["--sd gives 3 values for 2 settings", "one per setting in the order a, b"]),
        (["--settings", "a", "--sd", "1.5"], ["--settings 'a' names fewer than two settings", "e.g. base,tight"]),
        (["--settings", "a,b", "--sd", "1.5", "--seeds", "1"], ["--seeds 1", "give a count from 2 to 1000"]),
        (["--settings", "a,b", "--sd", "1.5", "--seeds", "3,3,3"], ["--seeds gives 3 counts for 2 settings"]),
        (["--settings", "a,b", "--sd", "1.5", "--seeds", "three"], ["--seeds three is not a whole number", "3,3,9"]),
        (["--settings", "a,b", "--sd", "1.5,x"], ["--sd x is not a positive number"]),
        (["--settings", "a,b", "--sd", "1.5", "--equivalence-margin", "0.02"], ["for 2 pp write --equivalence-margin 2"]),
        (["--settings", "a,b", "--sd", "1.5", "--equivalence-margin", "-1"], ["--equivalence-margin -1", "in pp, e.g. 2"]),
        (["--sd", "1.5", "--seeds", "3"], ["--seeds sizes a transfer study", "--settings a,b"]),
        (["--sd", "1.5,2"], ["--sd gives 2 values, and this plan has one setting"]),
    ],
)
def test_bad_transfer_input_is_one_sentence_naming_the_flag_and_exit_2(args, words):
    out = CliRunner().invoke(main_app, ["plan-seeds", "--factors", "a,b,c", "--effect", "4", *args])
    assert out.exit_code == 2, out.output
    assert all(w in out.output for w in words), out.output
    assert "Traceback" not in out.output and out.output.strip().count("\n") == 0


def test_a_spec_setting_without_runs_or_sd_is_named(tmp_path):
    path = write_spec(tmp_path / "new", factors=FACTORS[:3], settings=SETTINGS, seeds=3)
    out = CliRunner().invoke(main_app, ["plan-seeds", str(path), "--effect", "4"])
    assert out.exit_code == 2 and "pass --sd" in out.output, out.output
    out = CliRunner().invoke(main_app, ["plan-seeds", str(path), "--effect", "4", "--settings", "x,y", "--sd", "1"])
    assert out.exit_code == 2 and "--settings x,y differs from the settings the spec names (quiet, noisy)" in out.output


def test_no_seed_count_reaching_the_power_is_said_as_nan():
    planner = tp.Planner(tp.transfer_tests(FACTORS[:2])[0], [0.05, 0.05])
    found = tp.seeds_for(planner, tp.DIFFERS, 1e-5, np.inf, 0.8, tp.EQUAL)
    assert found.seeds is None and np.isnan(found.power)
    table = tp.plan_transfer(FACTORS[:2], [0.05, 0.05], tp.Question(1e-5, 0.02))
    assert table.loc[table["verdict"] == "differs", "seeds_per_cell"].isna().all()


def test_detectable_as_run_matches_the_closed_form_with_many_df():
    """Two settings, SE 0.5 pp each on very many df: Welch's test is the z test of the difference
    (se_d = 0.707 pp) at alpha / (5 x 20), so 80% power needs D = (z_{1 - .00025} + z_.8) se_d."""
    found = tp.detectable_differences([[0.005, 0.005]], [[1e6, 1e6]], tp.Adjustment(20, 5))
    level = 0.05 / 100
    closed = (stats.norm.ppf(1 - level / 2) + stats.norm.ppf(0.8)) * np.sqrt(2) * 0.005
    assert found[0] == pytest.approx(closed, rel=0.015)
    assert np.isnan(tp.detectable_differences([[0.005, np.nan]], [[10, 10]], tp.Adjustment(20, 5))[0])
