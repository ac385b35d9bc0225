"""Checkpoint retention of verl runs (ablation/runtime/backends/verl_checkpoints.py): what verl is
told to keep while a run trains, what the driver keeps once it is done, and the disk `validate`
prints. The driver's side (pruning when it records a done run, not after a failed attempt) is in
tests/e2e/test_verl_driver.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.backends.verl_checkpoints import own_checkpoint_dir, prune_checkpoints
from dapo_ablate.ablation.runtime.backends.verl_job import verl_job
from dapo_ablate.ablation.runtime.backends.verl_plan import checkpoint_saves
from dapo_ablate.cli.main import app
from dapo_ablate.core.config import build_trainer_config

from support import ROOT

EXAMPLE = ROOT / "examples" / "paper_verl.yaml"


def verl_checkpoints(folder: Path, steps: tuple[int, ...]) -> Path:
    """verl 0.9.1's layout: global_step_<n>/actor/... and the tracker file."""
    for step in steps:
        (folder / f"global_step_{step}" / "actor").mkdir(parents=True)
        (folder / f"global_step_{step}" / "actor" / "optim_world_size_8_rank_0.pt").write_bytes(b"adam")
    (folder / "latest_checkpointed_iteration.txt").write_text(str(max(steps)))
    return folder


@pytest.mark.parametrize("policy, left", [
    ("all", ["global_step_10", "global_step_15", "global_step_400", "global_step_5", "global_step_x", "latest_checkpointed_iteration.txt", "notes.txt"]),
    ("final", ["global_step_400", "global_step_x", "latest_checkpointed_iteration.txt", "notes.txt"]),
    ("none", ["global_step_x", "notes.txt"]),
])
def test_prune_keeps_what_the_policy_says_and_touches_nothing_else(policy: str, left: list[str], tmp_path: Path):
    folder = verl_checkpoints(tmp_path / "checkpoints", (5, 10, 15, 400))  # 400 > 15: by number, not by name
    (folder / "notes.txt").write_text("a user's file")
    (folder / "global_step_x").mkdir()  # not a step folder of verl's
    elsewhere = verl_checkpoints(tmp_path / "elsewhere", (20,))
    (folder / "global_step_20").symlink_to(elsewhere / "global_step_20")  # a link: neither counted nor followed
    prune_checkpoints(folder, policy)
    assert sorted(p.name for p in folder.iterdir() if p.name != "global_step_20") == left
    assert (elsewhere / "global_step_20" / "actor" / "optim_world_size_8_rank_0.pt").exists()


def test_none_removes_the_folder_it_empties_and_nothing_is_an_empty_folder(tmp_path: Path):
    folder = verl_checkpoints(tmp_path / "checkpoints", (5, 10))
    assert [p.name for p in prune_checkpoints(folder, "none")] == ["global_step_5", "global_step_10"]
    assert not folder.exists()
    assert prune_checkpoints(tmp_path / "never-saved", "final") == []  # save_freq -1: nothing to do


def test_checkpoints_elsewhere_are_not_ours_to_prune():
    config = expand(load_spec(EXAMPLE)).runs[0].config.to_dict()
    assert own_checkpoint_dir(build_trainer_config(config), "/shared/exp/run") == Path("/shared/exp/run/checkpoints")
    config["verl"]["overrides"] = ["trainer.default_local_dir=/shared/all-checkpoints"]
    assert own_checkpoint_dir(build_trainer_config(config), "/shared/exp/run") is None


def test_verl_keeps_at_most_max_checkpoints_of_the_actor_and_the_critic_while_training():
    spec = load_spec(EXAMPLE)
    words = shlex.split(verl_job(spec, expand(spec).runs[0]).entrypoint)
    assert "trainer.max_actor_ckpt_to_keep=2" in words and "trainer.max_critic_ckpt_to_keep=2" in words
    assert spec.executor.checkpoints_when_done == "final"
    assert checkpoint_saves(expand(spec).runs[0].config) == 80  # every 5 of 400 steps, the last one among them


def test_validate_prints_the_checkpoint_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    spec_path = tmp_path / "paper.yaml"
    spec_path.write_text(EXAMPLE.read_text())
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert result.exit_code == 0, result.output
    # 32e9 parameters x 12 bytes = 384 GB per save; 2 kept while training; the final one of 32 runs when done
    assert ("checkpoints: 80 saves per run of 384 GB each (fp32 weights + AdamW state, 12 bytes x 32B parameters); "
            "while a run trains up to 2 kept (768 GB, trainer.verl.max_checkpoints 2); once done final "
            "(executor.checkpoints_when_done): 384 GB per run, 12.3 TB for the 32 runs") in result.output
    spec_path.write_text(EXAMPLE.read_text().replace("checkpoints_when_done: final", "checkpoints_when_done: kept"))
    refused = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert refused.exit_code == 2 and "checkpoints_when_done" in refused.output and "Traceback" not in refused.output
