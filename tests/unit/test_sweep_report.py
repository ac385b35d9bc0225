"""The sweep report as a person reads it: percentage points with the unit in every header and
axis label, rounded knob values, a log axis for log-sampled knobs, integer trial ticks, the
importance warning below 20 trials, error bars only where seeds give an interval, and the
self-contained HTML page (names escaped).

Studies are built with the sweep's own spec, Optuna distributions and sampler (no training): each
trial's value and per-seed effects come from a known function of its knobs; the effects' means
and intervals from `sweeps.trials.mean_with_ci`, as the runner computes them.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_sweep_report_e2e.py."""

from __future__ import annotations

import html
import math
import re

import matplotlib.pyplot as plt
import optuna
import pytest
from matplotlib.container import ErrorbarContainer

from dapo_ablate.reports.export import markdown_text
from dapo_ablate.sweeps import plots
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.knobs import (
    format_params,
    knob_digits,
    knob_text,
    params_digits,
)
from dapo_ablate.sweeps.report import HTML_PAGE, build_report, write_report
from dapo_ablate.sweeps.report_data import shown_best, shown_trials
from dapo_ablate.sweeps.spec import build_sweep
from dapo_ablate.sweeps.trials import mean_with_ci

from tiny_configs import TINY_TRAINER

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {
    "eps_high": {"low": 0.2, "high": 0.4},
    "lr": {"low": 1.0e-4, "high": 1.0e-3, "log": True},
    "overlong_cache": {"choices": [4, 8, 12]},
}


def sweep_data(**fields) -> dict:
    return {"name": "look", "trainer": TINY_TRAINER, "space": SPACE, "n_trials": 4,
            "sampler": {"type": "random", "seed": 7}, **fields}


def accuracy(params: dict) -> float:
    """Peaks at eps_high 0.3 and lr 3e-4 (fractions in [0, 1])."""
    return 0.5 - 4 * (params["eps_high"] - 0.3) ** 2 - 0.05 * abs(math.log10(params["lr"] / 3e-4))


def fill(study: optuna.Study, spec, n_trials: int, seeds: int, factor: str = "clip_higher", pruned: int | None = None) -> None:
    """`n_trials` trials sampled by the sweep's own sampler; trial `pruned` is pruned at step 5."""
    for number in range(n_trials):
        trial = study.ask(fixed_distributions=studies.distributions(spec))
        value = accuracy(trial.params)
        if number == pruned:
            trial.report(value - 0.1, 5)
            trial.set_user_attr("pruned_at_step", 5)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        per_seed = [0.03 + 0.2 * (trial.params["eps_high"] - 0.28) + 0.01 * seed for seed in range(seeds)]
        trial.set_user_attr("effects", {factor: mean_with_ci(per_seed).to_dict()})
        study.tell(trial, value)


def report_of(n_trials: int, seeds: int, name: str = "look", factor: str = "clip_higher", pruned: int | None = 1):
    spec = build_sweep(sweep_data())
    study = optuna.create_study(study_name=name, direction="maximize", sampler=studies.make_sampler(spec))
    fill(study, spec, n_trials, seeds, factor, pruned)
    return build_report(study, spec.metric, list(spec.space), [factor])


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


# -- the pages and the CSVs ------------------------------------------------------------------
def headers(page: str) -> list[str]:
    """The header cells of every table on an HTML page, unescaped."""
    return [html.unescape(text) for text in re.findall(r"<th[^>]*>(.*?)</th>", page, flags=re.S)]


def markdown_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row, stripped of the padding that aligns them."""
    return [[cell.strip() for cell in line.strip()[1:-1].split(" | ")] for line in text.splitlines()
            if line.startswith("|") and not set(line) <= set("|-: ")]


# -- how values read ------------------------------------------------------------------------
def test_knob_values_read_rounded_to_their_significant_digits():
    assert knob_text(0.00031622776601683794) == "3.2e-4"
    assert knob_text(0.30000000000000004) == "0.3"
    assert knob_text(0.2) == "0.2"
    assert knob_text(12) == "12" and knob_text(True) == "True" and knob_text("adamw") == "adamw"
    assert knob_text(1e-6) == "1e-6" and knob_text(2_500_000.0) == "2.5e6" and knob_text(0.0) == "0"
    assert knob_text(0.000999) == "1e-3"  # 9.99e-4 rounds up a decade
    assert knob_text(0.3162, 3) == "0.316" and knob_text(None) == ""
    # the fewest digits (2 to 4) that keep a knob's values apart
    assert knob_digits([0.31, 0.3162]) == 2  # 0.31, 0.32
    assert knob_digits([0.312, 0.314]) == 3  # 0.31 twice at 2 digits
    assert knob_digits([0.31234, 0.31236]) == 4  # never more than 4


def test_the_console_shows_each_trials_knobs_as_the_report_does():
    """`format_params` at `params_digits` of the study's trials (the runner's trial lines and the
    best trial) reads exactly as the report's cells and its best-setting sentence."""
    report = report_of(8, seeds=1)
    settings = [{knob: row[knob] for knob in report.knobs} for _, row in report.trials.iterrows()]
    digits = params_digits(settings)
    shown = shown_trials(report).frame
    for params, (_, cells) in zip(settings, shown.iterrows()):
        assert format_params(params, digits) == " ".join(f"{knob}={cells[knob]}" for knob in report.knobs)
    best = dict(zip(report.knobs, report.best_params.iloc[0, 2:]))
    sentence = ", ".join(f"{knob}={cell}" for knob, cell in zip(report.knobs, shown_best(report).frame.iloc[0, 2:]))
    assert format_params(best, digits).replace(" ", ", ") == sentence
    # one rule: 0.000412 reads 4.1e-4 (not 0.000412), more digits only where the study's values need them
    assert format_params({"eps_high": 0.3162, "lr": 0.000412, "overlong_cache": 8}) == "eps_high=0.32 lr=4.1e-4 overlong_cache=8"
    assert params_digits([{"eps_high": 0.312}, {"eps_high": 0.314}]) == {"eps_high": 3}
    assert format_params({"eps_high": 0.312}, {"eps_high": 3}) == "eps_high=0.312"


# -- figures -----------------------------------------------------------------------------------
def test_effects_figure_with_one_seed_has_no_error_bars_and_promises_no_interval():
    report = report_of(8, seeds=1)
    figure = plots.effects_figure(report)
    axes = {axis.get_xlabel(): axis for axis in figure.axes}
    assert set(axes) == {"eps_high", "lr", "overlong_cache"}
    assert axes["lr"].get_xscale() == "log" and axes["eps_high"].get_xscale() == "linear"
    assert not any(isinstance(c, ErrorbarContainer) for axis in figure.axes for c in axis.containers)
    title = figure.get_suptitle()
    assert "no interval" in title and "CI" not in title and "95%" not in title
    assert axes["eps_high"].get_ylabel().endswith("(pp)")
    # the points are the effects in percentage points
    (points,) = [line for line in axes["eps_high"].get_lines() if line.get_linestyle() == "None"]
    assert sorted(points.get_ydata()) == pytest.approx(sorted(100 * report.effects["effect"]))
    # a categorical knob: its choices in numeric order, not as text ("12" before "4")
    figure.canvas.draw()
    assert [t.get_text() for t in axes["overlong_cache"].get_xticklabels()] == ["4", "8", "12"]


def test_effects_figure_with_seeds_draws_their_intervals():
    report = report_of(8, seeds=3)
    figure = plots.effects_figure(report)
    bars = [c for axis in figure.axes for c in axis.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 3  # one per knob panel, every setting has an interval
    assert "95% t interval over seeds" in figure.get_suptitle()


def test_log_knob_axis_has_round_rounded_ticks():
    report = report_of(8, seeds=1)
    figure = plots.knob_figure(report)
    (lr,) = [axis for axis in figure.axes if axis.get_xlabel() == "lr"]
    assert lr.get_xscale() == "log"
    figure.canvas.draw()
    low, high = lr.get_xlim()
    labels = [t.get_text() for t in lr.get_xticklabels() if low <= t.get_position()[0] <= high]
    assert len(labels) >= 3 and all(re.fullmatch(r"\d(e-\d)?|0\.\d+", text) for text in labels), labels
    assert figure.axes[0].get_ylabel() == "avg@4 (pp)"


def test_history_figure_ticks_whole_trial_numbers():
    report = report_of(3, seeds=1)  # 3 trials: a plain axis would tick 0, 0.25, 0.5, ...
    figure = plots.history_figure(report)
    (axis,) = figure.axes
    figure.canvas.draw()
    ticks = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    assert axis.get_ylabel() == "avg@4 (pp)" and axis.get_xlabel() == "trial number"


def test_a_hostile_knob_or_factor_name_is_inert_on_both_pages_and_in_the_figures(tmp_path):
    knob, factor = "<b>lr</b>$\\undefinedcommand{x}$|*_", "<i>on</i>$x^$|"
    study = optuna.create_study(study_name="hostile", direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    for _ in range(4):
        trial = study.ask({knob: optuna.distributions.FloatDistribution(1e-4, 1e-3, log=True)})
        effect = 10 * trial.params[knob]
        trial.set_user_attr("effects", {factor: mean_with_ci([effect, effect + 0.01]).to_dict()})
        study.tell(trial, 0.3 + 100 * trial.params[knob])
    report = build_report(study, "avg@4", [knob], [factor])
    paths = {p.name for p in write_report(report, tmp_path)}
    assert {"knobs.png", "effects.png", "history.png", "importances.png"} <= paths  # "$...$" drawn as text
    page = (tmp_path / HTML_PAGE).read_text()
    assert "<b>" not in page and "<i>" not in page
    assert knob in headers(page) and f"effect.{factor} (pp)" in headers(page)
    text = (tmp_path / "report.md").read_text()
    assert "<b>" not in text and "<i>" not in text
    assert markdown_text(knob) in text and markdown_text(factor) in text and r"\|" in markdown_text(knob)
    assert all(len(row) == len(markdown_rows(text)[0]) for row in markdown_rows(text)[:2])  # no "|" splits a row


def test_a_study_without_a_complete_trial_still_gets_its_pages(tmp_path):
    spec = build_sweep(sweep_data())
    study = optuna.create_study(study_name="empty", direction="maximize")
    empty = build_report(study, spec.metric, list(spec.space), [])
    assert {p.name for p in write_report(empty, tmp_path / "none")} == {
        "report.md", HTML_PAGE, "best_params.csv", "trials.csv", "importances.csv", "units.csv"}
    assert "The study has no trial yet." in (tmp_path / "none" / HTML_PAGE).read_text()

    trial = study.ask(fixed_distributions=studies.distributions(spec))
    trial.set_user_attr("error", "trial 0: ValueError: <b>bad</b> | x")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    failed = build_report(study, spec.metric, list(spec.space), [])
    paths = {p.name for p in write_report(failed, tmp_path / "failed")}
    assert not {name for name in paths if name.endswith(".png")}  # nothing to draw
    page = (tmp_path / "failed" / HTML_PAGE).read_text()
    assert re.search(r"<td[^>]*>trial 0: ValueError: &lt;b&gt;bad&lt;/b&gt; \| x</td>", page) and "<b>" not in page
    assert "No complete trial yet." in page
    assert r"trial 0: ValueError: &lt;b>bad&lt;/b> \| x" in (tmp_path / "failed" / "report.md").read_text()
