"""Transfer studies as a user meets them: the settings in `validate`'s plan and `status`'s table,
and examples/transfer_paper.yaml accepted by `dapo-ablate validate` once its paths exist.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_transfer_examples_e2e.py."""

from __future__ import annotations

import os

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.plan import format_plan
from dapo_ablate.ablation.store.results import status_rows
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.cli.main import app

from test_run_cli import write_spec
from support import ROOT


EXAMPLES = ROOT / "examples"

SETTINGS = [
    {"name": "tight", "overrides": {"rollout.max_response_len": 16, "algorithm": {"overlong_cache": 4}}},
    {"name": "low-lr", "overrides": {"optim.lr": 1.0e-4}},
]


def _paper_example_here(tmp_path: Path) -> Path:
    """examples/transfer_paper.yaml with its machine-specific paths (checkpoints, data, ledger,
    MLflow, Ray address, CPUs per run) pointed at this machine; every other value as shipped."""
    trainer = yaml.safe_load((EXAMPLES / "paper_qwen32b.yaml").read_text())
    spec = yaml.safe_load((EXAMPLES / "transfer_paper.yaml").read_text())
    assert spec["trainer"] == "paper_qwen32b.yaml"
    for name in ("train.parquet", "aime.jsonl"):
        (tmp_path / name).write_text("")
    trainer["model"]["path"] = str(tmp_path / Path(trainer["model"]["path"]).name)
    trainer["data"]["train"], trainer["data"]["eval"] = str(tmp_path / "train.parquet"), str(tmp_path / "aime.jsonl")
    (tmp_path / "paper_qwen32b.yaml").write_text(yaml.safe_dump(trainer))
    (tmp_path / "Qwen2.5-32B").mkdir()
    (tmp_path / "Qwen2.5-32B" / "config.json").write_text('{"max_position_embeddings": 32768}')
    for setting in spec["settings"]:
        if "model.path" in setting["overrides"]:
            model = tmp_path / Path(setting["overrides"]["model.path"]).name
            model.mkdir()
            (model / "config.json").write_text('{"max_position_embeddings": 32768}')
            setting["overrides"]["model.path"] = str(model)
    spec["executor"]["address"] = None  # this machine stands in for a cluster node: a run's CPUs must fit it
    spec["executor"]["cpus_per_run"] = min(spec["executor"]["cpus_per_run"], os.cpu_count() or 1)
    spec["tracking"]["uri"] = f"sqlite:///{tmp_path}/runs/mlflow.db"
    spec["ledger"] = f"sqlite:///{tmp_path}/runs/ledger.db"
    spec["output_dir"] = str(tmp_path / "runs")
    path = tmp_path / "transfer_paper.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_plan_lists_each_setting_with_its_overrides_and_the_attempts(tmp_path: Path):
    spec = load_spec(write_spec(tmp_path, settings=SETTINGS))
    text = format_plan(expand(spec))
    assert "settings    tight   algorithm.overlong_cache=4, rollout.max_response_len=16" in text
    assert "            low-lr  optim.lr=0.0001" in text
    assert "runs        8 = 4 unique cells x 2 settings x 1 seed" in text
    assert "2 attempts per run in all (executor.retries 1))" in text
    (tmp_path / "plain").mkdir()
    plain = format_plan(expand(load_spec(write_spec(tmp_path / "plain"))))
    assert "settings" not in plain and "4 = 4 unique cells x 1 seed" in plain


def test_status_labels_every_run_with_its_setting_grouped_in_spec_order(tmp_path: Path):
    spec_path = write_spec(tmp_path, settings=SETTINGS)
    spec = load_spec(spec_path)
    rows, counts = status_rows(spec, expand(spec))
    assert [row["setting"] for row in rows] == ["tight"] * 4 + ["low-lr"] * 4
    assert rows[0]["label"] == "tight baseline" and rows[4]["label"] == "low-lr baseline"
    assert all(row["label"].startswith(row["setting"] + " ") for row in rows)
    assert counts["new"] == 8
    result = CliRunner().invoke(app, ["status", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "tight OF+CH" in result.stdout and "low-lr OF+CH" in result.stdout and "new 8" in result.stdout


def test_cpu_transfer_example_moves_the_quickstart_along_one_axis_per_setting(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its ledger and MLflow paths are relative: nothing may appear here
    path = EXAMPLES / "transfer.yaml"
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "48 = 16 unique cells x 3 settings x 1 seed" in result.stdout and "resolution V" in result.stdout
    assert list(tmp_path.iterdir()) == []
    spec = load_spec(path)
    overrides = {s.name: s.overrides for s in spec.settings}
    assert overrides["base"] == {}
    sections = {name: {key.split(".")[0] for key in o} for name, o in overrides.items() if o}
    assert sections == {"tight": {"rollout", "algorithm"}, "comparison": {"data"}}  # a length regime; a task
    trainers = dict(spec.setting_trainers())
    assert trainers["comparison"].data.builtin_task == "comparison"
    assert trainers["tight"].rollout.max_response_len < trainers["base"].rollout.max_response_len
    estimate = expand(spec).estimate()
    assert estimate.run_seconds / 2 <= 20 * 60  # two at a time on a 2-core machine, within 20 minutes


def test_paper_transfer_example_validates_once_its_paths_exist(tmp_path: Path):
    path = _paper_example_here(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "48 = 16 unique cells x 3 settings x 1 seed" in result.stdout
    assert "resolution V" in result.stdout and "1 GPU per run" in result.stdout
    assert "qwen7b-instruct  model.path=" in result.stdout
    assert sorted(tmp_path.rglob("*")) == before  # validate writes nothing
    trainers = dict(load_spec(path).setting_trainers())
    assert list(trainers) == ["paper", "qwen7b-base", "qwen7b-instruct"]
    assert [Path(t.model.path).name for t in trainers.values()] == ["Qwen2.5-32B", "Qwen2.5-7B", "Qwen2.5-7B-Instruct"]
    for trainer in trainers.values():  # the paper's recipe in every setting: data, instruction, lengths, clip
        assert trainer.data.prompt_template == "dapo" and trainer.data.verifier == "answer_line"
        assert trainer.rollout.max_response_len == 20480 and trainer.eps_high_effective == 0.28
        assert trainer.batch.prompts_per_step == 512 and trainer.rollout.engine == "vllm"


# ------------------------------------------------------------------ built-in settings: difficulty
def test_difficulty_mix_sets_the_number_of_terms_in_training_and_held_out_problems():
    from dapo_ablate.core.config import TrainerConfig
    from dapo_ablate.core.tasks import generate_problems
    from dapo_ablate.core.trainer import BUILTIN_EVAL_SEED, load_task

    def terms(prompt: str) -> int:
        return prompt.count("+") + 1

    default = load_task(TrainerConfig(data={"builtin_train_size": 500}))
    assert [p for p, _ in default.held_out] == [p.prompt for p in generate_problems(64, BUILTIN_EVAL_SEED)]
    assert {terms(p) for p, _ in default.train + default.held_out} == {2, 3, 4, 5, 6}
    for low, high in ((2, 3), (4, 6)):
        task = load_task(TrainerConfig(data={"builtin_train_size": 500, "builtin_min_terms": low, "builtin_max_terms": high}))
        for problems in (task.train, task.held_out):
            counts = {terms(p) for p, _ in problems}
            assert counts == set(range(low, high + 1)), (low, high, counts)
        assert all(int(a) == sum(map(int, p[:-1].split("+"))) for p, a in task.held_out)


@pytest.mark.parametrize(("data", "words"), [
    ({"builtin_min_terms": 5, "builtin_max_terms": 3}, "data.builtin_min_terms (5) exceeds builtin_max_terms (3)"),
    ({"builtin_max_terms": 12}, "builtin_max_terms"),
    ({"builtin_min_terms": 1}, "builtin_min_terms"),
])
def test_bad_difficulty_mix_is_one_sentence_naming_the_field(data, words):
    from dapo_ablate.core.config import ConfigError, build_trainer_config

    with pytest.raises(ConfigError) as err:
        build_trainer_config({"data": data})
    assert words in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------ built-in settings: noisy verifier
def test_flip_verdicts_flips_the_stated_share_reproducibly():
    import torch

    from dapo_ablate.core.update import flip_verdicts

    correct = torch.rand(200_000, generator=torch.Generator().manual_seed(0)) < 0.3
    assert torch.equal(flip_verdicts(correct, 0.0, 1), correct)
    noisy = flip_verdicts(correct, 0.2, 1)
    assert abs((noisy ^ correct).float().mean().item() - 0.2) < 0.005
    assert torch.equal(noisy, flip_verdicts(correct, 0.2, 1))
    assert not torch.equal(noisy, flip_verdicts(correct, 0.2, 2))


# ------------------------------------------------------------ built-in settings: partial credit
def test_format_credit_rewards_a_well_formed_wrong_answer_only():
    import torch

    from dapo_ablate.core.config import ConfigError, build_trainer_config
    from dapo_ablate.core.update import format_credit, shape_rewards

    texts = ["3,7\nAnswer: 7", "3,8\nAnswer: 8", "3,8\nno answer line", "3,8,9,10\nAnswer: 10"]
    correct = torch.tensor([True, False, False, False])
    truncated = torch.tensor([False, False, False, True])
    binary = build_trainer_config({"algorithm": {"overlong_cache": 8}})
    assert torch.equal(format_credit(binary, texts, correct, truncated), torch.zeros(4))
    partial = binary.with_overrides({"algorithm.format_reward": 0.5})
    credit = format_credit(partial, texts, correct, truncated)
    assert credit.tolist() == [0.0, 0.5, 0.0, 0.0]
    rewards, _ = shape_rewards(partial, correct, torch.tensor([4, 4, 4, 9]))
    assert (rewards + credit).tolist() == [1.0, -0.5, -1.0, -1.0]
    with pytest.raises(ConfigError, match="format_reward"):
        build_trainer_config({"algorithm": {"format_reward": 2.0}})
