"""Hostile input, round three, more members of the same classes: bounded waits on a tracking server
that accepts a connection and then never answers, or answers with a status MLflow retries for
minutes; records beside an experiment's spec (origin.json) that someone else wrote."""

from __future__ import annotations

import socket
import threading

import pytest

from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.tracking import check_server_reachable


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
