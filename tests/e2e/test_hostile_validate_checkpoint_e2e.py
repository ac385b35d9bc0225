"""A checkpoint.pt that is not one this product wrote for the run (garbage, empty, truncated,
pickled code, the wrong shape) is one sentence naming the file and the fix, exit 2, through
`dapo-ablate train`: never a traceback, never code run, the file left as it was."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dapo_ablate.cli.main import app
from dapo_ablate.core.config import TrainerConfig

from tiny_configs import TINY_TRAINER


class _Planted:
    """Unpickling this would create the file `path`: what a planted checkpoint could do."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def truncated_zip() -> bytes:
    buffer = io.BytesIO()
    torch.save({"config_digest": "x", "model": {"w": torch.zeros(1000)}}, buffer)
    data = buffer.getvalue()
    assert zipfile.is_zipfile(io.BytesIO(data))
    return data[: len(data) // 2]


def saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


DIGEST = TrainerConfig(**TINY_TRAINER).digest()
CASES = {
    "garbage": lambda tmp: b"this is not a checkpoint\n" * 40,
    "empty": lambda tmp: b"",
    "truncated zip": lambda tmp: truncated_zip(),
    "pickled code": lambda tmp: saved({"config_digest": DIGEST, "model": _Planted(tmp / "code-ran")}),
    "not a mapping": lambda tmp: saved([1, 2, 3]),
    "no config digest": lambda tmp: saved({"model": {}}),
    "this config's digest, nothing else": lambda tmp: saved({"config_digest": DIGEST}),
    "this config's digest, a model that is not a state dict": lambda tmp: saved({
        "config_digest": DIGEST, "model": [1], "optimizer": {}, "sampler": {}, "update_gen": torch.zeros(1),
        "result": {}}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_this_product_did_not_write_is_one_sentence(tmp_path, case):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(TINY_TRAINER))
    out = tmp_path / "out"
    out.mkdir()
    checkpoint = out / "checkpoint.pt"
    checkpoint.write_bytes(CASES[case](tmp_path))
    before = checkpoint.read_bytes()
    result = CliRunner().invoke(app, ["train", str(config), "--out", str(out), "--no-progress"])
    # the last line is the sentence; before it, only transformers' own "Loading weights" bar,
    # which `train --no-progress` does not silence yet (cli/train_cmd.py)
    *before_it, message = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert message.startswith("error: ") and "Traceback" not in result.output, result.output
    assert all(line.startswith("Loading weights") for line in before_it), result.output
    assert str(checkpoint) in message and "delete it or pass --no-resume" in message, message
    assert checkpoint.read_bytes() == before and not (out / "result.json").exists()
    assert not (tmp_path / "code-ran").exists()


def test_a_finished_result_the_disk_cannot_hold_is_printed_logged_and_not_lost(tmp_path, monkeypatch):
    """`train` whose result.json write fails (a full disk: only that write is made to fail, the
    training is real): the result is printed as JSON and logged to MLflow, then one sentence, exit 2."""
    import json as json_

    from dapo_ablate.core import atomic
    from dapo_ablate.core import result as result_module

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**TINY_TRAINER, "schedule": {"total_steps": 1, "eval_every": 1}}))
    out = tmp_path / "out"

    def full_disk(path, text):
        if Path(path).name == "result.json":
            raise OSError(28, "No space left on device")
        return atomic.write_text(path, text)

    monkeypatch.setattr(result_module, "write_text", full_disk)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ran = CliRunner().invoke(app, ["train", str(config), "--out", str(out), "--no-progress", "--tracking", uri])
    *before, printed, message = [line for line in ran.output.strip().splitlines() if not line.startswith("Loading weights")]
    assert ran.exit_code == 2 and "Traceback" not in ran.output, ran.output
    assert message.startswith("error: training finished, but ") and "No space left on device" in message, message
    assert "printed above as JSON and logged to MLflow" in message, message
    kept = json_.loads(printed)
    assert kept["steps"] == 1 and len(kept["eval"]) == 2 and not (out / "result.json").exists()

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("config").experiment_id])
    assert run.info.status == "FINISHED"
    final = [value for key, value in run.data.metrics.items() if key.endswith("acc/mean_at_4")]
    assert final == [pytest.approx(kept["eval"][-1]["avg@4"])], run.data.metrics  # verl's name for avg@4


def test_a_checkpoint_of_another_config_is_still_set_aside_and_the_run_starts_afresh(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**TINY_TRAINER, "schedule": {"total_steps": 1, "eval_every": 0}}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(saved({"config_digest": "another config"}))
    result = CliRunner().invoke(app, ["train", str(config), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert (out / "result.json").is_file()
