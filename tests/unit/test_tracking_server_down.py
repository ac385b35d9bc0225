"""Bounded waits: against an `http://` tracking server that does not answer, `report SPEC`, `ui`
and `train --tracking` are one sentence within seconds, exit 2 (MLflow's own client retries for
minutes, then `report` ended in a traceback)."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.cli.main import app

from support import free_port, record_finished, write_spec


@pytest.fixture
def down(tmp_path):
    """A finished experiment whose MLflow parent lives on a server nobody listens on."""
    path = write_spec(tmp_path, "down", tracking={"uri": f"http://127.0.0.1:{free_port()}"})
    spec = load_spec(path)
    record_finished(spec, "0123456789abcdef")
    return path, spec


@pytest.mark.parametrize("command", ["report", "ui"])
def test_an_unreachable_tracking_server_is_one_sentence_within_seconds(down, tmp_path, command):
    path, spec = down
    argv = [command, str(path)] + (["--out", str(tmp_path / "report")] if command == "report" else ["--port", str(free_port())])
    started = time.monotonic()
    result = CliRunner().invoke(app, argv)
    assert time.monotonic() - started < 30, "waited on MLflow's retries"
    assert result.exit_code == 2, result.output
    assert f"the MLflow tracking server at {spec.tracking.uri} does not answer" in result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "report").exists()
