"""What `run` checks before any verl job is submitted (ablation/runtime/backends/verl_cluster.py,
verl_data.py), in this process: flash-attn when the resolved config needs it, the interpreter the
jobs' entrypoint runs, the model folder and the parquet files, the evaluation set's size, and a
SQLite / file MLflow store refused for a job on several nodes; and what `validate` shows of them.

The same checks on a Ray cluster of two nodes with different environments are in
tests/e2e/test_verl_preflight_nodes.py."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.backends.verl import needs_flash_attn
from dapo_ablate.ablation.runtime.backends.verl_cluster import (
    FLASH_ATTN,
    node_needs,
    shared_tracking_problem,
)
from dapo_ablate.ablation.runtime.backends.verl_data import eval_set
from dapo_ablate.ablation.runtime.backends.verl_job import REQUIREMENTS
from dapo_ablate.ablation.runtime.backends.verl_plan import gpu_hours
from dapo_ablate.cli.main import app
from dapo_ablate.core.config import build_trainer_config

from support import ROOT

EXAMPLE = ROOT / "examples" / "paper_verl.yaml"
NO_FLASH = ("+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "actor_rollout_ref.model.use_remove_padding=false")


def paper_config(**verl):
    config = expand(load_spec(EXAMPLE)).runs[0].config.to_dict()
    config["verl"].update(verl)
    return build_trainer_config(config)


def write_parquet(path: Path, prompts: list[str]) -> Path:
    """A verl-format evaluation file: one row per prompt (a chat list), with its answer."""
    table = pa.table({"data_source": ["aime"] * len(prompts),
                      "prompt": [[{"role": "user", "content": p}] for p in prompts],
                      "reward_model": [{"ground_truth": "1", "style": "rule"}] * len(prompts)})
    pq.write_table(table, path)
    return path


def model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_flash_attn_is_needed_by_verls_defaults_by_padding_removal_and_by_ulysses():
    assert needs_flash_attn(paper_config())  # verl's flash_attention_2 and padding removal, Ulysses 8
    assert not needs_flash_attn(paper_config(overrides=list(NO_FLASH), sequence_parallel_size=1))
    assert needs_flash_attn(paper_config(overrides=list(NO_FLASH), sequence_parallel_size=8))
    assert needs_flash_attn(paper_config(overrides=[NO_FLASH[0]], sequence_parallel_size=1))  # padding removal
    assert needs_flash_attn(paper_config(overrides=[NO_FLASH[1]], sequence_parallel_size=1))  # flash attention
    needs = node_needs([paper_config()], REQUIREMENTS, "sqlite:///x.db", "paper")
    assert needs.requirements["flash-attn"] == FLASH_ATTN["flash-attn"] and "flash_attn" in needs.modules
    plain = node_needs([paper_config(overrides=list(NO_FLASH), sequence_parallel_size=1)], REQUIREMENTS, "x", "paper")
    assert "flash-attn" not in plain.requirements and "flash_attn" not in plain.modules
    assert needs.model_paths == ["/models/Qwen2.5-32B"]
    assert needs.data_files == {"/data/dapo-math-17k.parquet": "data.train", "/data/aime-2024.parquet": "data.eval"}


def test_a_sqlite_or_file_store_is_refused_for_a_job_on_several_nodes():
    problem = shared_tracking_problem("sqlite:////shared/mlflow.db", 16)
    assert problem == ("tracking.uri sqlite:////shared/mlflow.db is a SQLite file, which the 16 nodes of one verl job "
                       "cannot write safely (file locking over NFS or Lustre is unreliable, and verl drops a write that "
                       "still fails after its retries); set tracking.uri to an MLflow tracking server (http://HOST:5000) "
                       "or a database URI (postgresql://...)")
    assert "is a local folder" in shared_tracking_problem("file:///shared/mlruns", 2)
    assert "is a local folder" in shared_tracking_problem("/shared/mlruns", 2)
    assert shared_tracking_problem("sqlite:////shared/mlflow.db", 1) is None  # one node: the node check decides
    assert shared_tracking_problem("http://mlflow:5000", 16) is None
    assert shared_tracking_problem("postgresql+psycopg://u@db/mlflow", 16) is None


def test_the_evaluation_sets_rows_and_distinct_prompts(tmp_path: Path):
    found = eval_set(str(write_parquet(tmp_path / "aime.parquet", ["p1", "p2", "p3"] * 2)))
    assert (found.rows, found.prompts, found.samples(4)) == (6, 3, 24)
    assert found.describe(4) == ("6 rows x val n 4 = 24 samples per evaluation (3 distinct prompts, each about 2 times: "
                                 "the same avg@4 from one copy of each costs 12)")
    assert eval_set(str(tmp_path / "missing.parquet")) is None
    config = paper_config()
    per_30_rows = gpu_hours(config, 60) - gpu_hours(config, 30)  # evaluation's share scales with the rows
    assert per_30_rows > 0 and gpu_hours(config, 960) - gpu_hours(config, 30) == pytest.approx(31 * per_30_rows)
    assert gpu_hours(config) == gpu_hours(config, 30)  # rows unknown: AIME's 30 assumed


def validate_output(spec_text: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    spec_path = folder / "spec.yaml"
    spec_path.write_text(spec_text)
    monkeypatch.chdir(folder)
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert result.exit_code == 0, result.output
    return result.output


def test_validate_shows_the_evaluations_samples_and_estimates_from_the_real_row_count(tmp_path: Path, monkeypatch):
    once = write_parquet(tmp_path / "aime-once.parquet", [f"problem {i}" for i in range(30)])
    repeated = write_parquet(tmp_path / "aime-960.parquet", [f"problem {i}" for i in range(30)] * 32)
    text = EXAMPLE.read_text()
    outputs = {}
    for name, path in (("once", once), ("repeated", repeated)):
        (tmp_path / name).mkdir()
        outputs[name] = validate_output(text.replace("/data/aime-2024.parquet", str(path)), tmp_path / name, monkeypatch)
    assert f"evaluation {once}: 30 rows x val n 32 = 960 samples per evaluation; 81 evaluations per run" in outputs["once"]
    assert (f"evaluation {repeated}: 960 rows x val n 32 = 30,720 samples per evaluation (30 distinct prompts, each "
            "about 32 times: the same avg@32 from one copy of each costs 960); 81 evaluations per run") in outputs["repeated"]

    def total(output: str) -> int:
        return int(re.search(r"\): ([\d,]+) in all", output).group(1).replace(",", ""))

    assert total(outputs["repeated"]) > total(outputs["once"])
    # the paper's 16-node jobs on a SQLite store: `run` will refuse it, and validate says so
    assert "run will refuse this spec: tracking.uri sqlite:///" in outputs["once"]
    (tmp_path / "server").mkdir()
    single = text.replace("gpus_per_run: 128", "gpus_per_run: 8")
    assert "run will refuse" not in validate_output(single, tmp_path / "server", monkeypatch)
