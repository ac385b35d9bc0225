"""Hostile state: an adaptive experiment's look rows edited by hand in the ledger (a record that is
not a mapping, a look adding a cell the design does not have, a gap in the look numbers) are one
sentence naming the look and the fix, exit 2, from every command that reads the looks (status,
validate, report, run: `run` reads them where `run --dry-run` does, before Ray starts), never a traceback."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.binding import experiment_digest
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.cli.main import app

from support import write_spec

RESULT = {"metrics": {"avg@32": 0.5}, "eval_curve": [{"step": 2, "avg@32": 0.5}], "signals": [],
          "tokens_generated": 100, "tokens_discarded": 0, "wall_s": 0.1}


@pytest.fixture
def adaptive(tmp_path):
    """An adaptive experiment whose stage 1 is done and whose two looks each added a run."""
    path = write_spec(tmp_path, "adapt", design="adaptive", adaptive={"max_seeds": 4})
    spec = load_spec(path)
    (tmp_path / "out").mkdir(exist_ok=True)
    grown = [("00", 1), ("11", 1)]
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict(), digest=experiment_digest(spec))
        for number in (1, 2):
            plan = expand(spec, grown[:number - 1])
            ledger.add_runs(spec.name, plan.run_specs())
            for run in plan.runs:
                if ledger.claim(run.run_id, "h"):
                    ledger.finish(run.run_id, RESULT)
            ledger.record_look(spec.name, number, {"runs": len(plan.runs), "added": [list(grown[number - 1])],
                                                   "stopped": False, "summary": "1 run added"})
    return path, spec


EDITS = {
    "not a mapping": ("record = :value", {"value": json.dumps([1, 2])}, ["look 2", "not a mapping"]),
    "not JSON": ("record = :value", {"value": "{not json"}, ["look 2"]),
    "unknown cell": ("record = :value", {"value": json.dumps({"added": [["0x1", 2]], "stopped": False})},
                     ["look 2", "'0x1'"]),
    "a gap": ("number = 3", {}, ["look 3", "look 2"]),
}


@pytest.mark.parametrize("command", ["status", "validate", "report", "run"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_look_is_one_sentence_naming_it_and_the_fix(adaptive, tmp_path, edit, command):
    path, spec = adaptive
    assignment, values, words = EDITS[edit]
    engine = create_engine(spec.ledger)
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE looks SET {assignment} WHERE number = 2"), values)
    engine.dispose()
    argv = [command, str(path)] + {"report": ["--out", str(tmp_path / "report")], "run": ["--dry-run"]}.get(command, [])
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output
    message = result.output.lower()
    assert all(word.lower() in message for word in words), result.output
    assert "delete" in message  # the fix: delete that look and those after it; `run` makes them again
