"""The slower cases of tests/unit/test_binding.py (a real `ui` server on a free port): in this tree so
the fast tier stays near a minute."""

from __future__ import annotations

from pathlib import Path


def test_ui_port_0_serves_on_a_free_port_the_link_names(tmp_path: Path):
    """Port 0 had MLflow pick a port the health check never found (a wait for ever): the server
    is now given a port the system says is free, and its link and health check name it."""
    import socket

    from mlflow import MlflowClient

    from dapo_ablate.ablation.app.experiment import store_ui_server
    from dapo_ablate.ablation.store.runs_view import RunsView

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("exp")
    view = RunsView(name="runs", rank_by="metrics.`avg@32`", columns=())
    server = store_ui_server(uri, "exp", view, "its runs", "dapo-ablate run spec.yaml", 0)
    assert server.port != 0 and f":{server.port}/" in server.link and f":{server.port}/" in server.health_url
    assert server.command[server.command.index("--port") + 1] == str(server.port)
    with socket.socket() as sock:  # free: the server can bind it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", server.port))
