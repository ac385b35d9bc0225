"""The slower cases of tests/unit/test_adaptive_drivers.py (several adaptive drivers on one ledger,
each through its own look): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

import pytest

from dapo_ablate.ablation.store.adaptive_state import current_plan
from dapo_ablate.ablation.store.ledger import SQLLedger

from test_adaptive_drivers import (  # noqa: F401, F811 - shared with the fast part
    Dying,
    Scripted,
    adaptive_spec,
    driver,
    inline,
    stored_looks,
)


def test_a_driver_that_planned_before_another_drivers_looks_ends_with_their_plan(inline, tmp_path, ledger_url):
    spec = adaptive_spec(tmp_path, ledger_url)
    stale = current_plan(spec, None)  # the second driver planned stage 1 (4 runs) before any look
    first = Scripted({1: [("00", 1), ("11", 1)]})
    done = driver(spec, first).run()
    assert done.exit_code == 0 and len(done.records) == 6 and first.seen == [(1, 4, 4), (2, 6, 6)]

    second = Scripted({})
    summary = driver(spec, second, plan=stale).run()
    assert second.seen == []  # the stored looks decided: no look of its own on a stale plan
    assert summary.exit_code == 0 and summary.counts["done"] == 6 and sum(summary.counts.values()) == 6
    assert len(summary.records) == 6 and len(summary.plan.runs) == 6  # the last look's runs, not stage 1's 4
    assert [look["number"] for look in stored_looks(spec)] == [1, 2]


def test_a_driver_catches_up_with_a_look_another_driver_made_before_it_looks(inline, tmp_path, ledger_url):
    spec = adaptive_spec(tmp_path, ledger_url)
    stale = current_plan(spec, None)
    with pytest.raises(RuntimeError, match="died"):  # the first driver made look 1, trained its runs, died at look 2
        driver(spec, Dying({1: [("10", 1)]})).run()
    assert [look["runs"] for look in stored_looks(spec)] == [4]

    second = Scripted({})
    summary = driver(spec, second, plan=stale).run()
    assert second.seen == [(2, 5, 5)]  # look 2 made on the plan look 1 grew, with every run it holds
    assert [look["runs"] for look in stored_looks(spec)] == [4, 5]
    assert summary.exit_code == 0 and len(summary.plan.runs) == 5 and len(summary.records) == 5


def test_a_driver_whose_last_runs_another_driver_holds_says_so_and_exits_0(inline, tmp_path, ledger_url):
    spec = adaptive_spec(tmp_path, ledger_url)
    plan = current_plan(spec, None)
    held = plan.runs[-1].run_id
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        assert ledger.claim(held, "another-host")  # the other driver trains it (its lease is live)
    policy = Scripted({})
    summary = driver(spec, policy).run()
    assert policy.seen == []  # no look before every run is done
    assert summary.counts["done"] == 3 and summary.counts["running"] == 1 and summary.held == 1
    assert summary.exit_code == 0 and not summary.all_done
