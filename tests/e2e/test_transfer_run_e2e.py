"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_transfer_run.py
describes; its docstring says what they check."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.results import load_experiment_results

from test_run_cli import write_spec
from test_run_cli_e2e import finish, ledger_state, mlflow_runs, start, wait_for
from test_transfer_run import SETTINGS  # noqa: F401, F811 - shared with the fast part


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
    description = re.sub(r"\\(.)", r"\1", parents[0].data.tags["mlflow.note.content"])  # Markdown escapes undone
    assert len(parents) == 1 and "slow-lr" in description
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
