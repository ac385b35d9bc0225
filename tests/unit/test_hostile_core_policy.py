"""Hostile model folders and context lengths through core/policy.py: an empty, incomplete
or garbage checkpoint folder is one ConfigError sentence naming it and what is missing, a pickled
weights file is refused without running it, and a prompt + response ceiling beyond the model's
positions is refused from config.json alone (no torch), so `validate` can say so before a run starts."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_ablate.core.config import ConfigError, ModelConfig
from dapo_ablate.core.policy import (
    BuiltinRecipe,
    builtin_model,
    builtin_tokenizer,
    check_context,
    check_model_folder,
    load_policy,
    model_context,
)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A real, loadable Hugging Face folder: the built-in architecture at its smallest, untrained."""
    folder = tmp_path_factory.mktemp("tiny") / "model"
    tokenizer = builtin_tokenizer()
    recipe = BuiltinRecipe(hidden_size=16, num_layers=1, intermediate_size=16)
    builtin_model(recipe, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def copy_of(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    return copy


def load_refusal(folder: Path) -> str:
    with pytest.raises(ConfigError) as error:
        load_policy(ModelConfig(path=str(folder)))
    message = str(error.value)
    assert message.startswith(f"model.path {str(folder)!r}") and "\n" not in message, message
    return message.removeprefix(f"model.path {str(folder)!r}")


def test_an_empty_folder_names_what_is_missing(tmp_path):
    (tmp_path / "empty").mkdir()
    assert load_refusal(tmp_path / "empty").startswith(" has no config.json")


def test_a_garbage_config_is_named(tiny_folder, tmp_path):
    folder = copy_of(tiny_folder, tmp_path)
    (folder / "config.json").write_bytes(b"\xff not json")
    assert "config.json is not valid UTF-8 JSON" in load_refusal(folder)


def test_garbage_weights_are_one_sentence(tiny_folder, tmp_path):
    folder = copy_of(tiny_folder, tmp_path)
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    assert load_refusal(folder).startswith(" cannot be loaded by transformers (")


def test_a_folder_without_weights_or_tokenizer_names_both(tiny_folder, tmp_path):
    folder = copy_of(tiny_folder, tmp_path)
    for name in ("model.safetensors", "tokenizer.json"):
        (folder / name).unlink()
    message = load_refusal(folder)
    assert "has no weights (model.safetensors or pytorch_model.bin) and no tokenizer" in message


def test_a_tokenizer_config_alone_is_no_tokenizer(tiny_folder, tmp_path):
    """transformers would load it as a one-token tokenizer that encodes every prompt to nothing."""
    folder = copy_of(tiny_folder, tmp_path)
    (folder / "tokenizer.json").unlink()
    assert (folder / "tokenizer_config.json").is_file()
    assert "has no tokenizer" in load_refusal(folder)


class _Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickled_weights_are_refused_without_running_them(tiny_folder, tmp_path):
    folder = copy_of(tiny_folder, tmp_path)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    message = load_refusal(folder)
    assert "pickle objects other than tensors" in message and "weights_only=False" not in message
    assert not marker.exists()


def test_check_model_folder_reads_config_only(tiny_folder):
    assert check_model_folder(tiny_folder)["model_type"] == "qwen2"


def write_config(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_response_ceiling_beyond_the_builtin_policy_is_refused():
    with pytest.raises(ConfigError, match=r"max_response_len 20480 .* context of 96 positions; lower max_response_len to at most 95"):
        check_context("builtin", 1, 20480)
    assert check_context("builtin", 16, 32) == 96


def test_a_folder_context_is_read_from_its_config(tmp_path):
    folder = write_config(tmp_path, {"model_type": "qwen2", "max_position_embeddings": 4096})
    assert check_context(folder, 2048, 2048) == 4096
    with pytest.raises(ConfigError, match="lower max_response_len to at most 2048"):
        check_context(str(folder), 2048, 20480)
    with pytest.raises(ConfigError, match="prompt of 4096 tokens already fills"):
        check_context(folder, 4096, 1)


def test_rope_scaling_stretches_the_context_as_vllm_counts_it():
    yarn = {"max_position_embeddings": 32768,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    assert model_context(yarn) == 131072
    llama3 = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert model_context(llama3) == 131072
    assert model_context({"n_positions": 1024}) == 1024  # GPT-2
    assert model_context({"text_config": {"max_position_embeddings": 8192}}) == 8192


def test_an_unknown_context_checks_nothing():
    assert check_context("Qwen/Qwen2.5-32B", 2048, 20480) is None  # a hub name: verl resolves it
    assert check_context({"model_type": "custom"}, 2048, 20480) is None


def test_a_transformers_config_object_is_accepted():
    from transformers import Qwen2Config

    with pytest.raises(ConfigError, match="context of 512 positions"):
        check_context(Qwen2Config(max_position_embeddings=512), 100, 500)


def test_the_context_check_imports_no_torch(tmp_path):
    folder = write_config(tmp_path, {"model_type": "qwen2", "max_position_embeddings": 4096})
    code = ("import sys; from dapo_ablate.core.policy import check_context; "
            f"print(check_context({str(folder)!r}, 1, 100), 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.split() == ["4096", "False"]
