"""Two drivers on one adaptive experiment (runtime.adaptive on the one Driver, its pool in this
process, the ledger on SQLite and PostgreSQL): a driver that planned before another driver's
looks catches up with them before it looks or stops, so it never makes a look on a stale plan and
ends with the plan (and so the headline) of the ledger's last look; a driver whose remaining runs
another driver holds says so and exits 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.spec import build_spec
from dapo_ablate.ablation.runtime import experiment_run
from dapo_ablate.ablation.runtime.adaptive import LookOutcome
from dapo_ablate.ablation.runtime.driver import Driver
from dapo_ablate.ablation.runtime.experiment_run import ExperimentRun
from dapo_ablate.ablation.runtime.factorial import ExperimentSummary, RunOptions
from dapo_ablate.ablation.runtime.pool import Outcome
from dapo_ablate.ablation.store.adaptive_state import current_plan
from dapo_ablate.ablation.store.ledger import SQLLedger

import test_driver
from support import spec_data, write_spec


class InlinePool(test_driver.InlinePool):
    """test_driver's in-process pool, with the recording a scheduler asks of it; an empty poll waits for nothing."""

    def poll(self, max_wait_s=None) -> list[Outcome]:
        return super().poll(max_wait_s) if self.flights else []

    def record(self, run_id: str, result: dict[str, Any]) -> bool:
        return self.ledger.finish(run_id, result)

    def fail(self, run_id: str, error: str) -> bool:
        return self.ledger.fail(run_id, error, self.host)


class Scripted:
    """A look policy adding the scripted runs at each look (none: stop); records what it saw."""

    def __init__(self, script: dict[int, list[tuple[str, int]]]) -> None:
        self.script, self.seen = script, []

    def __call__(self, plan, records: list[dict[str, Any]], looks: list[dict[str, Any]]) -> LookOutcome:
        number = len(looks) + 1
        self.seen.append((number, len(plan.runs), len(records)))
        add = self.script.get(number, [])
        return LookOutcome({"runs_seen": len(records)}, add, f"{len(add)} runs added" if add else "every term decided")


def cell(config: dict, run_dir: str, eval_cache_dir: str | None) -> dict:
    """avg@32 0.25, +0.5 with clip_higher, +0.01 per seed (no run folder: nothing to count)."""
    accuracy = 0.25 + 0.5 * config["techniques"]["clip_higher"] + 0.01 * config["schedule"]["seed"]
    return {"metrics": {"avg@32": accuracy}, "eval_curve": [{"step": 2, "avg@32": accuracy}], "signals": [],
            "tokens_generated": 100, "tokens_discarded": 10, "wall_s": 0.1}


@pytest.fixture
def inline(monkeypatch):
    monkeypatch.setattr(Driver, "pool_factory", InlinePool)
    monkeypatch.setattr(experiment_run, "capacity", lambda spec, runs: 1)


def adaptive_spec(tmp_path: Path, ledger_url: str):
    return build_spec(spec_data(tmp_path, "adapt", design="adaptive", adaptive={"max_seeds": 4}, ledger=ledger_url))


def driver(spec, policy: Scripted, plan=None) -> ExperimentRun:
    """A driver that planned now (or with `plan`: when it started, before other drivers looked)."""
    with SQLLedger(spec.ledger) as ledger:
        plan = plan or current_plan(spec, ledger)
    return ExperimentRun(spec, plan, cell, RunOptions(progress=False), ledger=SQLLedger(spec.ledger), policy=policy)


def stored_looks(spec) -> list[dict[str, Any]]:
    with SQLLedger(spec.ledger) as ledger:
        return ledger.looks(spec.name)


class Dying(Scripted):
    def __call__(self, plan, records, looks) -> LookOutcome:
        if len(looks) + 1 == 2:
            raise RuntimeError("the driver died at look 2")
        return super().__call__(plan, records, looks)


def test_the_run_line_names_the_runs_another_driver_holds(monkeypatch, tmp_path):
    from dapo_ablate.ablation.app import experiment as app
    from dapo_ablate.cli.main import app as cli

    summary = ExperimentSummary("adapt", {"pending": 0, "running": 1, "done": 3, "failed": 0}, finished=3, held=1)
    monkeypatch.setattr(app, "run", lambda *args, **kwargs: app.RunOutcome(summary, None, "dapo-ablate ui out/adapt"))
    path = write_spec(tmp_path, "adapt")
    result = CliRunner().invoke(cli, ["run", str(path)])
    assert result.exit_code == 0, result.output
    assert "1 not finished (1 held by another driver, which finishes it; `status` shows when)" in result.output
