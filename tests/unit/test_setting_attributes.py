"""A setting says what it is: model family, size and type, task and length ceiling, as recorded
attributes (the spec's, else read from the trainer), without changing any existing spec's dump,
digest or runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dapo_ablate.ablation.experiment.setting_info import model_attributes
from dapo_ablate.ablation.experiment.spec import ExperimentSpec, SpecError, load_spec
from dapo_ablate.ablation.store.binding import experiment_digest
from dapo_ablate.core.config import TrainerConfig
from dapo_ablate.core.contracts import SettingInfo

from support import ROOT


def _trainer(path: str) -> TrainerConfig:
    return TrainerConfig().model_copy(update={"model": TrainerConfig().model.model_copy(update={"path": path})})


@pytest.mark.parametrize("path, expected", [
    ("/models/Qwen2.5-7B-Instruct", ("qwen2.5", "7B", "instruct")),
    ("/models/Qwen2.5-32B", ("qwen2.5", "32B", None)),  # a name that does not say its type leaves it unknown
    ("/m/DeepSeek-R1-Distill-Qwen-1.5B/", ("deepseek-r1-distill-qwen", "1.5B", "distilled")),
    ("/m/my-policy", (None, None, None)),
])  # fmt: skip
def test_model_attributes_read_from_a_checkpoint_name(path, expected):
    found = model_attributes(_trainer(path))
    assert (found["model_family"], found["model_size"], found["model_type"]) == expected


def _spec_with(tmp_path: Path, **extra) -> ExperimentSpec:
    data = yaml.safe_load((ROOT / "examples" / "transfer.yaml").read_text())
    data.update(extra)
    path = tmp_path / "transfer.yaml"
    path.write_text(yaml.safe_dump(data))
    (tmp_path / "dapo_cpu.yaml").write_text((ROOT / "examples" / "dapo_cpu.yaml").read_text())
    return load_spec(path)


def test_an_existing_spec_gets_defaults_from_its_trainers_and_dumps_as_before(tmp_path):
    spec = load_spec(ROOT / "examples" / "transfer.yaml")
    infos = {info.name: info for info in spec.setting_infos()}
    assert infos["tight"] == SettingInfo("tight", "builtin", "small", None, "addition", 16)
    assert infos["comparison"].task == "comparison" and infos["base"].max_response_len == 32
    dump = spec.to_dict()
    assert "attributes" not in dump and "confirm" not in dump
    assert all(set(setting) == {"name", "overrides"} for setting in dump["settings"])


def test_stated_attributes_win_and_do_not_change_the_design(tmp_path):
    plain = _spec_with(tmp_path)
    settings = [dict(s) for s in yaml.safe_load((ROOT / "examples" / "transfer.yaml").read_text())["settings"]]
    settings[1]["attributes"] = {"model_type": "instruct", "model_size": 7}
    described = _spec_with(tmp_path, attributes={"model_family": "qwen2.5", "task": "math"}, settings=settings)
    infos = {info.name: info for info in described.setting_infos()}
    assert infos["base"] == SettingInfo("base", "qwen2.5", "small", None, "math", 32)
    assert infos["tight"] == SettingInfo("tight", "qwen2.5", "7", "instruct", "math", 16)
    assert experiment_digest(described) == experiment_digest(plain)  # descriptive: the name stays bound to its runs


def test_a_wrong_model_type_is_one_sentence(tmp_path):
    with pytest.raises(SpecError, match="model_type"):
        _spec_with(tmp_path, attributes={"model_type": "chat"})


def test_confirm_names_a_predictions_file_relative_to_the_spec(tmp_path):
    spec = _spec_with(tmp_path, confirm={"predictions": "before/predictions.yaml"})
    assert Path(spec.confirm.predictions) == tmp_path / "before" / "predictions.yaml"
