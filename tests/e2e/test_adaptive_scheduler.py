"""The adaptive scheduler's mechanics (runtime.adaptive) on the one Driver, with cheap
cell functions and scripted look policies (the policy is an input of the scheduler; the real one,
the claims engine's, is tested in test_sequential and through `dapo-ablate run`): each look is
stored in the ledger once, its runs join the plan and train once, a driver stopped between looks
resumes without repeating a look or a run, and a finished adaptive experiment reruns in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.adaptive import LookOutcome
from dapo_ablate.ablation.runtime.executor import RunOptions, run_experiment
from dapo_ablate.ablation.store.adaptive_state import current_plan
from dapo_ablate.ablation.store.ledger import SQLLedger

from support import counting_cell


FACTORS = ["overlong_filter", "clip_higher"]


def calls(spec) -> list[int]:
    """How many times each run folder's run was started."""
    root = Path(spec.output_dir) / spec.name
    return [len((folder / "calls").read_text().splitlines()) for folder in root.iterdir() if (folder / "calls").exists()]


def write_spec(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    data = {"name": "adapt", "trainer": {"rollout": {"max_response_len": 64}, "algorithm": {"overlong_cache": 8}},
            "factors": FACTORS, "design": "adaptive", "seeds": 1, "adaptive": {"max_seeds": 4},
            "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Scripted:
    """A look policy that adds the scripted runs at each look (none: stop), and raises at a look
    named in `fail_at` (a driver dying between looks); records what it was shown."""

    def __init__(self, script: dict[int, list[tuple[str, int]]], fail_at: int | None = None) -> None:
        self.script, self.fail_at, self.seen = script, fail_at, []

    def __call__(self, plan, records: list[dict[str, Any]], looks: list[dict[str, Any]]) -> LookOutcome:
        number = len(looks) + 1
        self.seen.append((number, len(plan.runs), len(records)))
        if number == self.fail_at:
            raise RuntimeError(f"the driver died at look {number}")
        add = self.script.get(number, [])
        return LookOutcome({"decisions": {"OF": "undecided" if add else "not supported"}}, add,
                           f"{len(add)} runs added" if add else "every term decided")


def run(spec_path: Path, policy: Scripted):
    spec = load_spec(spec_path)
    with SQLLedger(spec.ledger) if Path(spec.ledger.removeprefix("sqlite:///")).exists() else _none() as ledger:
        plan = current_plan(spec, ledger)
    return spec, run_experiment(spec, plan, cell_fn=counting_cell, options=RunOptions(progress=False), policy=policy)


class _none:
    def __enter__(self):
        return None

    def __exit__(self, *exc: object) -> None:
        pass


def looks(spec) -> list[dict[str, Any]]:
    with SQLLedger(spec.ledger) as ledger:
        return ledger.looks(spec.name)


def test_each_look_grows_the_plan_once_and_the_last_one_stops(local_ray, tmp_path: Path):
    spec_path = write_spec(tmp_path)
    policy = Scripted({1: [("00", 1), ("11", 1)], 2: [("00", 2), ("01", 1), ("01", 2)]})
    spec, summary = run(spec_path, policy)
    assert summary.exit_code == 0 and summary.finished == 4 + 2 + 3
    assert policy.seen == [(1, 4, 4), (2, 6, 6), (3, 9, 9)]  # each look saw every planned run finished
    found = looks(spec)
    assert [look["number"] for look in found] == [1, 2, 3]
    assert [look["added"] for look in found] == [[["00", 1], ["11", 1]], [["00", 2], ["01", 1], ["01", 2]], []]
    assert [look["stopped"] for look in found] == [False, False, True] and found[2]["summary"] == "every term decided"
    plan = current_plan(spec, SQLLedger(spec.ledger))
    assert sorted((run.cell.key, run.seed) for run in plan.runs) == sorted(
        [(key, 0) for key in ("00", "01", "10", "11")] + [("00", 1), ("11", 1), ("00", 2), ("01", 1), ("01", 2)])
    assert calls(spec) == [1] * 9  # every run trained once
    assert len(summary.records) == 9

    again = Scripted({})
    _, rerun = run(spec_path, again)  # finished: no look, no run, no Ray
    assert again.seen == [] and rerun.finished == 0 and rerun.already_done == 9 and rerun.exit_code == 0


def test_a_driver_that_dies_at_a_look_resumes_after_the_last_recorded_one(local_ray, tmp_path: Path):
    spec_path = write_spec(tmp_path)
    with pytest.raises(RuntimeError, match="died at look 2"):
        run(spec_path, Scripted({1: [("10", 1)]}, fail_at=2))
    spec = load_spec(spec_path)
    assert [look["number"] for look in looks(spec)] == [1]
    with SQLLedger(spec.ledger) as ledger:
        assert sum(row["status"] == "done" for row in ledger.runs_table(spec.name)) == 5

    resumed = Scripted({2: [("10", 2)]})
    _, summary = run(spec_path, resumed)
    assert resumed.seen == [(2, 5, 5), (3, 6, 6)]  # look 1 is not made again; its run is not retrained
    assert summary.finished == 1 and summary.already_done == 5 and summary.exit_code == 0
    assert [look["number"] for look in looks(spec)] == [1, 2, 3]
    assert calls(spec) == [1] * 6
