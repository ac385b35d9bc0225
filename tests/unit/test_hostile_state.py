"""Hostile state: files and rows someone else put where the product keeps its own state. Only state
the product wrote (and sealed) for a run is trusted; anything else is ignored with a note and
computed again, or refused in one sentence naming the row or file and the fix.

The runs here are the real trainer on the built-in policy (a few seconds each), called as a Ray
task calls it (`run_cell`, with the experiment's worker key in its environment, as the driver's
pool sets it); the tests that start Ray and `dapo-ablate run` are in tests/e2e."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from dapo_ablate.ablation.runtime.cell import run_cell
from dapo_ablate.ablation.runtime.jobs import SEAL_ENV
from dapo_ablate.ablation.runtime.pool import worker_key
from dapo_ablate.core.config import TrainerConfig
from dapo_ablate.core.evaluation import cached_initial_eval

from tiny_configs import TINY_TRAINER

CHECKPOINTED = {**TINY_TRAINER, "schedule": {"total_steps": 4, "eval_every": 2, "checkpoint_every": 2}}


def config_of(seed: int) -> dict:
    return TrainerConfig(**copy.deepcopy({**CHECKPOINTED, "schedule": {**CHECKPOINTED["schedule"], "seed": seed}})).to_dict()


@pytest.fixture
def keyed(monkeypatch) -> bytes:
    """The task environment the driver gives a run: the experiment's worker key."""
    key = worker_key(b"k" * 32)
    monkeypatch.setenv(SEAL_ENV, key.hex())
    return key


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
    assert again["metrics"] == result["metrics"] and not [kind for kind, _, _ in resumed if kind in ("step", "note")]


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


@pytest.mark.parametrize("entry", ["plain metrics", "another key's", "a link"])
def test_an_evaluation_cache_entry_not_sealed_under_this_key_is_computed_again(tmp_path, entry):
    key, notes = "k" * 24, []
    path = tmp_path / f"initial-eval-{key}.json"
    if entry == "plain metrics":
        path.write_text(json.dumps({"step": 0, "avg@4": 0.99}))
    elif entry == "another key's":
        cached_initial_eval(tmp_path, key, lambda: {"step": 0, "avg@4": 0.99}, b"another experiment's key")
    else:
        (tmp_path / "outside.json").write_text(json.dumps({"step": 0, "avg@4": 0.99}))
        path.symlink_to(tmp_path / "outside.json")
    metrics = cached_initial_eval(tmp_path, key, lambda: {"step": 0, "avg@4": 0.25}, b"this experiment's key", notes.append)
    assert metrics == {"step": 0, "avg@4": 0.25} and len(notes) == 1 and str(path) in notes[0]
    assert cached_initial_eval(tmp_path, key, lambda: {"step": 0, "avg@4": 0.5}, b"this experiment's key", notes.append) == metrics
    assert len(notes) == 1 and not path.is_symlink()
