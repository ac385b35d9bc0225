"""Races between drivers of one adaptive experiment that the fuzz (tests/e2e/test_fuzz_adaptive_drivers.py)
found, each replayed at the one moment it needs: the other driver's write is made by the ledger
right after this driver's read (a real ledger on SQLite and PostgreSQL, the one Driver, its pool
in this process, as in test_adaptive_drivers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dapo_ablate.ablation.runtime import experiment_run
from dapo_ablate.ablation.runtime.driver import Driver
from dapo_ablate.ablation.runtime.experiment_run import ExperimentRun
from dapo_ablate.ablation.runtime.factorial import RunOptions
from dapo_ablate.ablation.store.adaptive_state import current_plan
from dapo_ablate.ablation.store.ledger import DONE, SQLLedger

from test_adaptive_drivers import InlinePool, Scripted, adaptive_spec, cell, stored_looks


@pytest.fixture
def inline(monkeypatch):
    monkeypatch.setattr(Driver, "pool_factory", InlinePool)
    monkeypatch.setattr(experiment_run, "capacity", lambda spec, runs: 1)


class OtherDriverActs(SQLLedger):
    """The ledger, where another driver does `act` with the run it holds (`held`) once every other
    run is done: right after this driver read the plan's rows (`reread` False), or just before."""

    def __init__(self, url: str, held: str, act: Callable[[SQLLedger], bool], *, reread: bool = False) -> None:
        super().__init__(url)
        self.held, self.act, self.reread, self.done = held, act, reread, False

    def runs_table(self, name: str) -> list[dict[str, Any]]:
        rows = super().runs_table(name)
        if not self.done and all(row["status"] == DONE or row["run_id"] == self.held for row in rows):
            self.done = True
            with SQLLedger(self.url) as other:
                assert self.act(other)
            if self.reread:
                rows = super().runs_table(name)
        return rows


def test_a_driver_that_left_a_held_run_publishes_nothing_when_the_other_driver_finishes_it_meanwhile(
        inline, tmp_path, ledger_url):
    spec = adaptive_spec(tmp_path, ledger_url)
    plan = current_plan(spec, None)
    held = plan.runs[-1]
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        assert ledger.claim(held.run_id, "another-host")  # the other driver trains it (its lease is live)
    result = cell(held.config.to_dict(), "", None)
    ledger = OtherDriverActs(spec.ledger, held.run_id, lambda other: other.finish(held.run_id, result))
    policy = Scripted({1: [("11", 1)]})
    summary = ExperimentRun(spec, plan, cell, RunOptions(progress=False), ledger=ledger, policy=policy).run()
    assert ledger.done and policy.seen == []  # it ended seeing the run held; the other driver finished it then
    # no look decided these 4 runs (the other driver makes look 1, which grows the plan): not "all done", no headline
    assert not summary.all_done and summary.held == 1 and summary.exit_code == 0
    assert stored_looks(spec) == []


def test_a_run_handed_back_pending_at_the_end_is_trained_by_the_driver_still_running(inline, tmp_path, ledger_url):
    spec = adaptive_spec(tmp_path, ledger_url)
    plan = current_plan(spec, None)
    held = plan.runs[-1]
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        assert ledger.claim(held.run_id, "another-host")  # the other driver trains it, then dies
    # it dies; a restarted one hands the run back pending (as `hosts.release_orphans` does)
    ledger = OtherDriverActs(spec.ledger, held.run_id, lambda other: other.release(held.run_id, host="another-host"),
                             reread=True)
    policy = Scripted({})  # look 1 stops
    summary = ExperimentRun(spec, plan, cell, RunOptions(progress=False), ledger=ledger, policy=policy).run()
    n = len(plan.runs)
    assert ledger.done and policy.seen == [(1, n, n)]  # it trained the handed-back run, then looked at all n
    assert summary.all_done and summary.exit_code == 0  # was: "1 not finished", exit 1
    assert len(stored_looks(spec)) == 1
