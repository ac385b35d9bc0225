"""A transfer study end to end on the scheduler: `dapo-ablate run` of a tiny two-setting spec is
killed part-way and rerun; every (setting, cell, seed) is then once in the ledger and once in
MLflow, whose child runs carry the setting as a param, a tag and a name prefix.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_transfer_run_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import SpecError, load_spec

from test_run_cli import write_spec


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
