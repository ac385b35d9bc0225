"""Hostile input, round three, more members of the same classes: bounded waits on a tracking server
that accepts a connection and then never answers, or answers with a status MLflow retries for
minutes; records beside an experiment's spec (origin.json) that someone else wrote."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.spec import load_spec, run_root
from dapo_ablate.ablation.runtime.executor import ORIGIN_RECORD, read_origin, record_spec
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.tracking import check_server_reachable
from dapo_ablate.cli.main import app

from support import HANG_GUARD_S, record_finished, write_spec


@pytest.fixture
def silent_server():
    """A port that accepts connections (the kernel's backlog) and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def failing_server():
    """A port whose every request gets HTTP 503 (what MLflow's client retries for minutes)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def answer() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_tracking_server_that_accepts_and_never_answers_is_one_sentence(silent_server):
    with pytest.raises(ExecutorError) as refused:
        check_server_reachable(silent_server, "check --tracking", timeout_s=0.5)
    message = str(refused.value)
    assert f"the MLflow tracking server at {silent_server} does not answer within 0.5 s" in message
    assert message.endswith("check --tracking") and "\n" not in message


def test_a_tracking_server_answering_a_status_mlflow_retries_is_one_sentence(failing_server):
    with pytest.raises(ExecutorError) as refused:
        check_server_reachable(failing_server, "check tracking.uri")
    message = str(refused.value)
    assert f"the MLflow tracking server at {failing_server} answers HTTP 503" in message
    assert message.endswith("check tracking.uri") and "\n" not in message


# -- origin.json: what `run` records beside the spec, read back by `report` ------------------------
@pytest.fixture
def recorded(tmp_path):
    """A finished experiment `run` recorded (spec.yaml and origin.json in its folder)."""
    path = write_spec(tmp_path, "origin")
    spec = load_spec(path)
    record_finished(spec)
    record_spec(spec, {"spec": str(path), "overrides": [], "command": f"dapo-ablate run {path}"})
    return path, run_root(spec) / ORIGIN_RECORD


@pytest.mark.parametrize("text", [
    '{"trainer_file": 123, "command": 5, "recorded": [1], "overrides": "x"}',
    '{"trainer_file": ["a"], "spec": {"a": 1}}',
    "[" * 100_000 + "]" * 100_000,
], ids=["numbers", "containers", "nesting"])
def test_an_origin_record_someone_else_wrote_is_left_out_of_the_report(recorded, tmp_path, text):
    path, origin = recorded
    origin.write_text(text)
    result = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "report"), "--format", "md"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert f"Spec: dapo-ablate run {path}" in (tmp_path / "report" / "report.md").read_text()


def test_an_origin_record_that_is_a_fifo_is_not_opened(recorded):
    """A FIFO at origin.json kept `report` waiting for a writer for ever."""
    _, origin = recorded
    origin.unlink()
    os.mkfifo(origin)
    read: list[dict] = []
    reader = threading.Thread(target=lambda: read.append(read_origin(origin.parent)), daemon=True)
    reader.start()
    reader.join(HANG_GUARD_S)
    if reader.is_alive():  # let the reader go before failing
        os.close(os.open(origin, os.O_WRONLY | os.O_NONBLOCK))
    assert read == [{}]
