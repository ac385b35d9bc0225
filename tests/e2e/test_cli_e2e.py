"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_cli.py
describes; its docstring says what they check."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dapo_ablate.cli.main import app

from test_cli import tiny_yaml  # noqa: F401, F811 - shared with the fast part


def test_train_with_overrides_runs_the_overridden_steps(tiny_yaml, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["train", str(tiny_yaml), "schedule.total_steps=2", "schedule.eval_every=0", "--out", str(out), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "result.json").read_text())
    assert saved["steps"] == 2 and saved["config"]["schedule"]["total_steps"] == 2
    assert json.loads((out / "config.json").read_text())["schedule"]["total_steps"] == 2
