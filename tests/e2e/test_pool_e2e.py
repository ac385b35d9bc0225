"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_pool.py
describes; its docstring says what they check."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import SQLLedger

from support import calls, counting_cell, rows, run, write_spec
from test_faults import dropped_connection
from test_pool import quick_retries  # noqa: F401, F811 - shared with the fast part

# -- blips while runs are in flight ---------------------------------------------------------------
real_claim, real_heartbeat = SQLLedger.claim, SQLLedger.heartbeat


def beat_waiting_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """Finishes once the driver has renewed a lease (the heartbeat patch below drops a file
    next to the run folders), so that every run lives through at least one heartbeat."""
    beat = Path(run_dir).parent.parent / "beat"
    for _ in range(1200):  # a bound for a broken driver, not a timing assumption
        if beat.exists():
            break
        time.sleep(0.1)
    return counting_cell(config, run_dir, eval_cache_dir)


# -- the sweep runs on the same pool ---------------------------------------------------------------
def hanging_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    """Evaluates step 0, then hangs far past any test's timeout."""
    if on_eval is not None:
        on_eval(0, {"step": 0, "avg@4": 0.1})
    time.sleep(3600)
    return {}


def unstorable_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """The CH-only cell returns a result the ledger refuses (an unknown key whose name reads
    like a database clue); the others are fine."""
    result = counting_cell(config, run_dir, eval_cache_dir)
    techniques = config["techniques"]
    if techniques["clip_higher"] and not techniques["overlong_filter"]:
        result["timeouts"] = 3
    return result


def test_a_blip_in_a_claim_or_a_heartbeat_is_ridden_out(local_ray, tmp_path, monkeypatch, quick_retries):
    failed: dict[str, int] = {"claim": 0, "heartbeat": 0}
    out = tmp_path / "out"

    def claim_failing_once(self, *args, **kwargs):
        if not failed["claim"]:
            failed["claim"] += 1
            raise dropped_connection()
        return real_claim(self, *args, **kwargs)

    def heartbeat_failing_once(self, run_id, host):
        if not failed["heartbeat"]:
            failed["heartbeat"] += 1
            raise dropped_connection()
        held = real_heartbeat(self, run_id, host)
        (out / "beat").write_text("")
        return held

    monkeypatch.setattr(SQLLedger, "claim", claim_failing_once)
    monkeypatch.setattr(SQLLedger, "heartbeat", heartbeat_failing_once)
    spec, summary = run(write_spec(tmp_path, executor={"retries": 0, "lease_s": 4}), beat_waiting_cell)
    assert failed == {"claim": 1, "heartbeat": 1}
    assert summary.exit_code == 0 and summary.failed_attempts == 0
    assert {row["status"] for row in rows(spec).values()} == {"done"}
    assert set(calls(spec).values()) == {1}  # nothing trained twice


def test_a_database_that_stays_down_during_heartbeats_stops_the_driver_with_a_sentence(local_ray, tmp_path, monkeypatch, quick_retries):
    def heartbeat_down(self, run_id, host):
        raise dropped_connection()

    def forever_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
        time.sleep(3600)
        return {}

    monkeypatch.setattr(SQLLedger, "heartbeat", heartbeat_down)
    with pytest.raises(ExecutorError, match="the ledger database failed while trying to renew the lease"):
        run(write_spec(tmp_path, executor={"retries": 0, "lease_s": 4, "max_concurrent": 1}), forever_cell)
    states = {row["status"] for row in rows(load_spec(tmp_path / "spec.yaml")).values()}
    assert "running" not in states  # the run in flight was given back on the way out


def test_a_sweep_run_past_run_timeout_s_fails_its_trial_and_the_sweep_ends(local_ray, tmp_path):
    from test_sweep import trials, write_sweep
    from test_sweep_e2e import sweep

    path = write_sweep(tmp_path, n_trials=2, executor={"retries": 0, "max_concurrent": 2, "run_timeout_s": 3})
    spec, summary = sweep(path, hanging_cell)
    assert summary.exit_code == 1 and len(summary.failures) == 2
    assert all("exceeded executor.run_timeout_s (3 s)" in error for error in summary.failures.values())
    assert [t.state.name for t in trials(spec)] == ["FAIL", "FAIL"]
    ledger_rows = SQLLedger(spec.ledger).runs_table(spec.name)
    assert {row["status"] for row in ledger_rows} == {"failed"}
    assert all("run_timeout_s" in row["error"] for row in ledger_rows)


def test_a_result_the_ledger_refuses_fails_its_run_and_blocks_no_later_run(local_ray, tmp_path, quick_retries):
    path = write_spec(tmp_path, executor={"retries": 0})
    spec, summary = run(path, unstorable_cell)  # not a database error: no retries, no driver stop
    assert summary.exit_code == 1 and len(summary.failures) == 1
    (error,) = summary.failures.values()
    assert "cannot be stored" in error and "database" not in error
    assert not list((tmp_path / "out" / spec.name).glob("*/finished-result.json"))
    spec, again = run(path, unstorable_cell)  # the next invocation starts normally
    assert again.already_done == 3
