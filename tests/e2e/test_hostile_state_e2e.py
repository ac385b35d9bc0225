"""The slower cases of tests/unit/test_hostile_state.py (real MLflow stores and training runs on forged
state): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.cell import run_cell
from dapo_ablate.ablation.runtime.executor import record_spec
from dapo_ablate.core.config import TrainerConfig

from support import write_spec
from test_hostile_state import config_of, keyed  # noqa: F401, F811 - shared with the fast part


def test_a_checkpoint_copied_from_another_run_and_edited_is_ignored_and_the_run_trains(tmp_path, keyed):
    """Run A's checkpoint, copied into run B's folder with B's config digest and a final avg@4 of
    0.99, would make B "finished" without training: it is ignored with a note, B trains."""
    first, second = config_of(0), config_of(1)
    run_cell(first, str(tmp_path / "a"), None)
    state = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    state["config_digest"] = TrainerConfig(**second).digest()
    state["result"]["eval"][-1]["avg@4"] = 0.99
    (tmp_path / "b").mkdir()
    torch.save(state, tmp_path / "b" / "checkpoint.pt")
    events: list[tuple[str, int, dict]] = []
    result = run_cell(second, str(tmp_path / "b"), None, on_event=lambda *event: events.append(event))
    assert result["metrics"]["avg@4"] != 0.99
    assert [step for kind, step, _ in events if kind == "step"] == [1, 2, 3, 4]
    notes = [data["message"] for kind, _, data in events if kind == "note"]
    assert len(notes) == 1 and "is not a checkpoint dapo-ablate sealed for this run" in notes[0], notes
    assert "trains from the start" in notes[0] and str(tmp_path / "b" / "checkpoint.pt") in notes[0]
    resumed: list[tuple[str, int, dict]] = []  # its own sealed checkpoint (step 4) is trusted: nothing trains again
    again = run_cell(second, str(tmp_path / "b"), None, on_event=lambda *event: resumed.append(event))
    measured = {"peak_rss_mb"}  # this process's memory, measured again when the result is read back
    assert {k: v for k, v in again["metrics"].items() if k not in measured} == {
        k: v for k, v in result["metrics"].items() if k not in measured}
    assert not [kind for kind, _, _ in resumed if kind in ("step", "note")]


def test_a_forged_evaluation_cache_entry_is_ignored_and_computed_again(tmp_path, keyed):
    """Every run's step-0 point comes from the shared cache: an entry edited to 0.99 is ignored with
    a note, the evaluation is computed again, and the fresh sealed entry replaces it."""
    one_step = {**config_of(0), "schedule": {**config_of(0)["schedule"], "total_steps": 1, "checkpoint_every": 0}}
    cache = tmp_path / "eval-cache"
    first = run_cell(one_step, str(tmp_path / "a"), str(cache))
    [entry] = cache.glob("initial-eval-*.json")
    document = json.loads(entry.read_text())
    document["metrics"]["avg@4"] = 0.99
    entry.write_text(json.dumps(document))
    events: list[tuple[str, int, dict]] = []
    second = run_cell(one_step, str(tmp_path / "b"), str(cache), on_event=lambda *event: events.append(event))
    assert second["eval_curve"][0]["avg@4"] == first["eval_curve"][0]["avg@4"] != 0.99
    [note] = [data["message"] for kind, _, data in events if kind == "note"]
    assert str(entry) in note and "is not one dapo-ablate sealed" in note and "computed again" in note, note
    assert json.loads(entry.read_text())["metrics"]["avg@4"] == first["eval_curve"][0]["avg@4"]


def test_a_tracking_store_a_newer_mlflow_wrote_is_one_sentence_naming_the_fix(tmp_path: Path):
    """An MLflow store whose schema is at a revision the installed MLflow does not know (a newer
    MLflow wrote it): `report` writes the report, then says in one sentence that it was not logged,
    why, and to upgrade MLflow (was: a traceback advising `mlflow db upgrade`, which would damage
    it); a store at a known older revision keeps MLflow's own sentence."""
    import sqlite3

    from dapo_ablate.ablation.store.tracking import Tracker, newer_schema

    from support import dapo_ablate, record_finished

    spec = load_spec(write_spec(tmp_path, "newer"))
    tracker = Tracker(spec.tracking.uri, None, spec.name)
    parent = tracker.client.create_run(tracker.experiment_id).info.run_id
    record_finished(spec, parent_run_id=parent)
    record_spec(spec)
    database = spec.tracking.uri.removeprefix("sqlite:///")
    with sqlite3.connect(database) as connection:
        (known,), = connection.execute("SELECT version_num FROM alembic_version").fetchall()
        connection.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    result = dapo_ablate("report", str(tmp_path / "spec.yaml"), "--out", "report", cwd=tmp_path)  # MLflow caches stores per process
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (sentence,) = result.stderr.strip().splitlines()
    assert sentence.startswith("error: the report is written in report, but not logged to MLflow: ")
    assert "written by a newer MLflow than the installed" in sentence and "upgrade MLflow" in sentence, sentence
    assert (tmp_path / "report" / "report.md").is_file()
    old = f"Detected out-of-date database schema (found version {known}, but expected x)"
    assert newer_schema(old) is None and newer_schema(old.replace(known, "ffffffffffff")) == "ffffffffffff"
