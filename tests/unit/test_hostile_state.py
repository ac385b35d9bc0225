"""Hostile state: files and rows someone else put where the product keeps its own state. Only state
the product wrote (and sealed) for a run is trusted; anything else is ignored with a note and
computed again, or refused in one sentence naming the row or file and the fix.

The runs here are the real trainer on the built-in policy (a few seconds each), called as a Ray
task calls it (`run_cell`, with the experiment's worker key in its environment, as the driver's
pool sets it); the tests that start Ray and `dapo-ablate run` are in tests/e2e."""

from __future__ import annotations

import copy

import pytest
import torch

from dapo_ablate.ablation.runtime.cell import run_cell
from dapo_ablate.ablation.runtime.jobs import SEAL_ENV
from dapo_ablate.ablation.runtime.pool import worker_key
from dapo_ablate.core.config import TrainerConfig

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
