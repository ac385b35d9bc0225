"""The slower cases of tests/unit/test_verl_preflight.py (a real local Ray asked about its nodes): in
this tree so the fast tier stays near a minute."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dapo_ablate.ablation.runtime.backends.verl_cluster import (
    FLASH_ATTN,
    NodeNeeds,
    node_problems,
)

from test_verl_preflight import model_folder, write_parquet  # noqa: F401, F811 - shared with the fast part


def test_a_node_is_asked_for_the_model_the_data_and_flash_attn(tmp_path: Path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(uri).create_experiment("paper")
    model = model_folder(tmp_path / "Qwen2.5-0.5B")
    train = write_parquet(tmp_path / "train.parquet", ["1+1", "2+2"])
    needs = NodeNeeds({"mlflow": ">=3.0"}, uri, "paper", model_paths=[str(model)],
                      data_files={str(train): "data.train"}, python=None)
    assert node_problems(needs) == []
    (tmp_path / "pointer.parquet").write_text("version https://git-lfs.github.com/spec/v1\n")  # an LFS pointer
    broken = NodeNeeds({**FLASH_ATTN}, uri, "paper", modules=["flash_attn"],
                       model_paths=[str(tmp_path / "missing-model"), str(tmp_path)],
                       data_files={str(tmp_path / "eval.parquet"): "data.eval", str(tmp_path / "pointer.parquet"): "data.train"},
                       python=None)
    problems = node_problems(broken)
    assert problems[0] == "flash-attn is not installed (need flash-attn>=2.7)"
    assert problems[1].startswith("`import flash_attn` fails (ModuleNotFoundError")
    assert problems[2] == f"model.path {tmp_path / 'missing-model'} is not a Hugging Face checkpoint folder here (no config.json)"
    assert problems[3] == f"model.path {tmp_path} is not a Hugging Face checkpoint folder here (no config.json)"
    assert problems[4] == f"data.eval {tmp_path / 'eval.parquet'} is not a file here"
    assert problems[5].startswith(f"data.train {tmp_path / 'pointer.parquet'} is not a readable parquet file (")
    assert len(problems) == 6
    hub = NodeNeeds({}, uri, "paper", model_paths=["Qwen/Qwen2.5-32B"], data_files={"hdfs://data/x.parquet": "data.train"}, python=None)
    assert node_problems(hub) == []  # a hub name and a remote URI: fetched by verl itself, not on disk


def test_the_entrypoints_python3_must_be_the_environment_the_check_runs_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(uri).create_experiment("paper")
    needs = NodeNeeds({}, uri, "paper")  # python: the entrypoint's python3
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    assert node_problems(needs) == []  # this environment's python3 first, as on a cluster image
    other = tmp_path / "bin"
    other.mkdir()
    system = next(p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if Path(p).exists())
    (other / "python3").symlink_to(system)
    monkeypatch.setenv("PATH", os.pathsep.join([str(other), "/usr/bin", "/bin"]))
    (problem,) = node_problems(needs)
    assert problem.startswith(f"the jobs' entrypoint runs `python3` = {other / 'python3'} (environment ")
    assert f"not the Python Ray runs verl's workers in ({Path(sys.prefix).resolve()})" in problem
    assert problem.endswith(f"start Ray on this node with {Path(sys.executable).parent} first on PATH")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert "which is not on this node's PATH" in node_problems(needs)[0]
