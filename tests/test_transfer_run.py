"""A transfer study end to end on the scheduler: `dapo-ablate run` of a tiny two-setting spec is
killed part-way and rerun; every (setting, cell, seed) is then once in the ledger and once in
MLflow, whose child runs carry the setting as a param, a tag and a name prefix."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.store.results import load_experiment_results
from dapo_ablate.ablation.experiment.spec import SpecError, load_spec
from test_run_cli import finish, ledger_state, mlflow_runs, start, wait_for, write_spec

SETTINGS = [
    {"name": "slow-lr", "overrides": {"optim.lr": 1.0e-6}},
    {"name": "fast-lr", "overrides": {"optim": {"lr": 1.0e-5}}},
]


def test_settings_expand_in_every_setting_with_distinct_run_ids(tmp_path: Path):
    plan = expand(load_spec(write_spec(tmp_path, settings=SETTINGS, seeds=2)))
    assert plan.settings == ["slow-lr", "fast-lr"]
    assert len(plan.runs) == 2 * 4 * 2 and len({run.run_id for run in plan.runs}) == 16
    for run in plan.runs:
        assert run.name.startswith(f"{run.setting} ")
        assert run.config.optim.lr == (1e-6 if run.setting == "slow-lr" else 1e-5)
        assert run.to_run_spec().cell_key == f"{run.setting}/{run.cell.key}"


@pytest.mark.parametrize(
    "settings, words",
    [
        ([{"name": "a", "overrides": {"optim.nope": 1}}, {"name": "b"}], ["setting 'a'", "optim.nope"]),
        ([{"name": "a", "overrides": {"optim": {"lr": -1}}}, {"name": "b"}], ["setting 'a'", "optim.lr"]),
        ([{"name": "a"}, {"name": "a"}], ["setting 'a'", "twice"]),
        ([{"name": "a"}], ["two or more settings"]),
    ],
)
def test_bad_settings_are_one_sentence_naming_setting_and_key(tmp_path: Path, settings, words):
    with pytest.raises(SpecError) as error:
        load_spec(write_spec(tmp_path, settings=settings))
    assert all(w in str(error.value) for w in words), error.value
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_kill_and_rerun_gives_each_setting_cell_seed_once_in_ledger_and_mlflow(tmp_path: Path):
    spec_path = write_spec(tmp_path, settings=SETTINGS, seeds=2)  # 2 settings x 4 cells x 2 seeds
    driver = start(spec_path, sleep_s=1.0)
    wait_for(spec_path, driver, "done", at_least=4)
    driver.send_signal(signal.SIGKILL)
    finish(driver)
    runs, before = ledger_state(spec_path)
    assert 4 <= len(before) < 16

    code, _, err = finish(start(spec_path, sleep_s=0.1))
    assert code == 0, err
    runs, after = ledger_state(spec_path)
    plan = expand(load_spec(spec_path))
    assert set(runs) == {run.run_id for run in plan.runs} and all(r["status"] == "done" for r in runs.values())
    keys = [(r["cell_key"], r["seed"]) for r in runs.values()]
    assert len(keys) == len(set(keys)) == 16 and {k.split("/")[0] for k, _ in keys} == set(plan.settings)
    parents, children = mlflow_runs(spec_path)
    assert len(parents) == 1 and "slow-lr" in parents[0].data.tags["mlflow.note.content"]
    assert parents[0].data.tags["dapo.settings"] == "slow-lr,fast-lr"
    assert set(children) == set(runs) and all(len(found) == 1 for found in children.values())
    by_id = {run.run_id: run for run in plan.runs}
    for run_id, (child,) in children.items():
        setting = by_id[run_id].setting
        assert child.data.params["setting"] == child.data.tags["dapo.setting"] == setting
        assert child.info.run_name.startswith(f"{setting} ")
    results, factors, *_ = load_experiment_results(spec_path)
    assert list(results.columns[:1]) == ["setting"] and len(results) == 16
    assert results.groupby("setting").size().to_dict() == {"slow-lr": 8, "fast-lr": 8}
