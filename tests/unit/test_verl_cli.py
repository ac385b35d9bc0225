"""``dapo-ablate validate`` / ``run --dry-run`` on the paper's verl experiment: 32 verl commands and
a GPU-hour estimate, nothing written and nothing submitted."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.runtime.backends.verl import ENTRYPOINT
from dapo_ablate.ablation.runtime.backends.verl_job import verl_job
from dapo_ablate.ablation.runtime.backends.verl_plan import gpu_hours, model_params
from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.cli.main import app

from support import ROOT


EXAMPLE = ROOT / "examples" / "paper_verl.yaml"


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"]])
def test_validate_and_dry_run_print_the_32_verl_commands_and_gpu_hours_and_write_nothing(command: list[str], tmp_path: Path, monkeypatch):
    spec_path = tmp_path / "paper_verl.yaml"
    shutil.copy(EXAMPLE, spec_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*command, str(spec_path)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("  [")]
    assert len(lines) == 32
    hours = re.search(r"GPU-hours \(FLOP estimate[^)]*\): ([\d,]+) in all", result.output)
    assert hours and int(hours.group(1).replace(",", "")) > 0
    assert "scaled from the built-in CPU quickstart" not in result.output  # one time estimate per plan: the GPU-hour one
    assert "time and GPU-hours in the verl jobs' estimate below" in result.output
    plan = expand(load_spec(spec_path))
    by_name = {run.name: run for run in plan.runs}
    for line in lines:
        name, command_line = re.fullmatch(r"  \[(.+?)\] (.*)", line).groups()
        assert command_line == verl_job(load_spec(spec_path), by_name[name]).entrypoint  # exactly what is submitted
        words = shlex.split(command_line)
        assert " ".join(words[:3]) == ENTRYPOINT
        assert "trainer.nnodes=16" in words and "trainer.n_gpus_per_node=8" in words  # 128 GPUs on nodes of 8
    assert "16 node(s) x 8 GPU(s)" in result.output and "VERL_USE_EXTERNAL_MODULES=dapo_ablate.ablation.runtime.backends.verl_loss" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paper_verl.yaml"]


def test_gpu_hours_scale_with_the_model_and_the_techniques():
    plan = expand(load_spec(EXAMPLE))
    grpo = next(run for run in plan.runs if not any(run.factors.values()))
    dapo = next(run for run in plan.runs if all(run.factors.values()))
    assert model_params("/models/Qwen2.5-32B") == 32e9 and model_params("Qwen/Qwen2.5-Math-1.5B-Instruct") == 1.5e9
    assert model_params("/models/my-policy") is None
    assert gpu_hours(dapo.config) > gpu_hours(grpo.config)  # dynamic sampling refills the evicted groups


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"], ["run"]])
def test_a_cell_verl_cannot_run_exits_2_with_one_sentence_before_anything_is_written(command: list[str], tmp_path: Path, monkeypatch):
    spec_path = tmp_path / "paper_verl.yaml"
    spec_path.write_text(EXAMPLE.read_text().replace("    engine: vllm\n", "    engine: hf\n", 1))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*command, str(spec_path)])
    assert result.exit_code == 2, result.output
    assert "trainer.rollout.engine is hf, which is not a verl rollout on backend verl; set rollout.engine: vllm" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paper_verl.yaml"]


def test_the_paper_example_runs_the_recipes_settings_where_the_paper_is_silent(tmp_path: Path):
    """verl's recipe/dapo/run_dapo_qwen2.5_32b.sh: Ulysses 8, offload, 2048 + 20480-token budgets,
    left truncation, checkpoints every 5 steps (into the run's own folder; 2 kept, a listed difference)."""
    spec = load_spec(EXAMPLE)
    run = expand(spec).runs[0]
    words = shlex.split(verl_job(spec, run).entrypoint)
    for expected in ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=8", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", "actor_rollout_ref.ref.fsdp_config.param_offload=true",
                     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=22528", "actor_rollout_ref.rollout.max_num_batched_tokens=22528",
                     "data.truncation=left", "data.max_prompt_length=2048", "trainer.save_freq=5", "trainer.max_actor_ckpt_to_keep=2",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.actor.clip_ratio_c=10.0",
                     "trainer.nnodes=16", "trainer.n_gpus_per_node=8"):
        assert expected in words, expected
    checkpoints = next(w for w in words if w.startswith("trainer.default_local_dir=")).split("=", 1)[1]
    assert Path(checkpoints).is_absolute() and checkpoints.endswith(f"/{run.run_id}/checkpoints")


def test_the_estimate_follows_v1s_dispatch_not_the_recipes_rounds():
    """verl 0.9.1's V1 replay buffer, sync mode: the step's 512 prompts, 2 refills per evicted group,
    at most 3 x 512 in flight, all drained. At a drop share d, kept groups reach 512 after
    512 / (1 - d) finished ones, with 512 d / (1 - d) still in flight (at most 1,536):
    d 0.5: 1,024 + 512 = 1,536 (the previous estimate said 1,024); d 0.1: 568.9 + 56.9 = 625.8;
    d 0.8: 2,560 + min(1,536, 2,048) = 4,096. Without Dynamic Sampling: the batch alone."""
    from dapo_ablate.ablation.runtime.backends.verl_plan import generated_prompts, v1_prompts_per_step

    assert v1_prompts_per_step(512, 0.5, 3) == pytest.approx(1536)
    assert v1_prompts_per_step(512, 0.1, 3) == pytest.approx(512 / 0.9 + 512 * 0.1 / 0.9)
    assert v1_prompts_per_step(512, 0.8, 3) == pytest.approx(4096)
    assert v1_prompts_per_step(512, 0.0, 3) == 512
    plan = expand(load_spec(EXAMPLE))
    grpo = next(run for run in plan.runs if not any(run.factors.values()))
    dapo = next(run for run in plan.runs if all(run.factors.values()))
    assert (generated_prompts(grpo.config), generated_prompts(dapo.config)) == (512, pytest.approx(1536))


def test_validate_says_how_verl_samples_dynamically_and_that_the_round_limit_is_not_applied(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "Dynamic Sampling evicting 50% of groups, as verl's V1 dispatches" in result.output
    assert ("no round limit (algorithm.max_gen_rounds 10 is not applied). The estimate assumes 50% of groups evicted: "
            "1,536 prompts generated per step (3.00 x prompts_per_step)") in result.output


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"]])
def test_a_round_limit_verl_cannot_honour_is_refused_not_dropped(command: list[str], tmp_path: Path, monkeypatch):
    spec_path = tmp_path / "paper_verl.yaml"
    text = EXAMPLE.read_text()
    assert "    max_gen_rounds: 10 " in text
    spec_path.write_text(text.replace("    max_gen_rounds: 10 ", "    max_gen_rounds: 4 ", 1))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*command, str(spec_path)])
    assert result.exit_code == 2, result.output
    assert ("trainer.algorithm.max_gen_rounds (4) cannot be honoured: verl's V1 Dynamic Sampling has no round limit on "
            "backend verl; leave it at its default 10 (not applied; validate says so) or use backend builtin") in " ".join(result.output.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paper_verl.yaml"]
