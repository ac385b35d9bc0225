"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_stop_signals.py
describes; its docstring says what they check."""

from __future__ import annotations

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.executor import RunOptions, run_experiment
from dapo_ablate.ablation.runtime.mlflow_runs import MlflowRuns

from support import calls, counting_cell, rows, write_spec
from test_stop_signals import ctrl_c_swallowed  # noqa: F401, F811 - shared with the fast part


def test_a_ctrl_c_swallowed_while_runs_are_in_flight_stops_the_driver_at_its_next_step(local_ray, tmp_path, monkeypatch):
    start_child = MlflowRuns.starting

    def swallowed_once_a_run_is_claimed(self, run_id):
        env = start_child(self, run_id)
        if not swallowed:
            swallowed.append(run_id)
            ctrl_c_swallowed()
        return env

    swallowed: list[str] = []
    monkeypatch.setattr(MlflowRuns, "starting", swallowed_once_a_run_is_claimed)
    spec = load_spec(write_spec(tmp_path, executor={"max_concurrent": 1}))
    summary = run_experiment(spec, expand(spec), cell_fn=counting_cell, options=RunOptions(progress=False))
    assert summary.interrupted and summary.exit_code == 130
    assert sum(calls(spec).values()) <= 1  # no run was started after the Ctrl-C
    statuses = [row["status"] for row in rows(spec).values()]
    assert "running" not in statuses and statuses.count("done") <= 1  # the run in flight went back to pending
