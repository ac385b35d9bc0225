"""`dapo-ablate ui` on a copied `dapo-runs/`: it serves the copy (its artifacts, not the
original's), and MLflow's UI, loaded in headless Chromium, opens on the training-runs view with
every child run of the experiment.

The finished experiment is made once per module by the real `dapo-ablate run`, with a cell
function chosen through ``DAPO_ABLATE_CELL_FN=test_ui:finished_cell`` (no training).

MLflow 3's UI is a React app that nests child runs under a collapsed parent row, so a plain
``--dump-dom`` shows only the parent. The browser test drives Chromium over the DevTools
protocol on a pipe (``--remote-debugging-pipe``: no websocket library): it opens the runs page,
waits for the parent's row, expands it as a user would, and reads the page's text.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
from dapo_ablate.ablation.runtime.reaper import descendants, kill_session
from dapo_ablate.cli import run_cmd
from dapo_ablate.cli.main import app

COMMAND = str(Path(sys.executable).parent / "dapo-ablate")
TESTS = Path(__file__).resolve().parent
CHROMIUM = Path("/usr/bin/chromium")
CHILDREN = ["baseline s0", "OF s0", "CH s0", "OF+CH s0"]
SPEC = {
    "name": "ui-exp",  # the stores are the defaults, relative to the folder: sqlite:///dapo-runs/...
    "trainer": {
        "rollout": {"eval_k": 4, "max_response_len": 32}, "algorithm": {"group_size": 4, "overlong_cache": 8},
        "batch": {"prompts_per_step": 8, "mini_batch_size": 16},
    },
    "factors": ["overlong_filter", "clip_higher"], "seeds": 1, "executor": {"max_concurrent": 2},
}


def finished_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    """A run's result at once (runs in the Ray workers of the `dapo-ablate run` subprocess)."""
    gain = 0.5 * config["techniques"]["clip_higher"]
    return {"metrics": {"avg@4": 0.25 + gain}, "eval_curve": [{"step": 0, "avg@4": 0.25}, {"step": 2, "avg@4": 0.25 + gain}],
            "signals": [{"step": 1, "reward": 0.5}], "wall_s": 0.1}


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    """A folder with spec.yaml and the dapo-runs/ of its finished 4-run experiment."""
    folder = tmp_path_factory.mktemp("original")
    (folder / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    environment = {**os.environ, CELL_FN_ENV: "test_ui:finished_cell",
                   "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([COMMAND, "run", "spec.yaml", "--no-progress"], cwd=folder, env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=300)
    finally:
        kill_session(process.pid)
    assert process.returncode == 0, err[-3000:]
    assert "4/4 runs done" in out
    return folder


def copy_of(original: Path, where: Path) -> Path:
    """`original`'s spec and dapo-runs/ copied to `where`, as a user copies a finished experiment."""
    shutil.copytree(original, where, ignore=shutil.ignore_patterns("*.lock"))
    return where


def artifact_locations(folder: Path) -> list[str]:
    """The experiment's and its runs' artifact locations recorded in folder's MLflow store."""
    with sqlite3.connect(f"file:{folder / 'dapo-runs' / 'mlflow.db'}?mode=ro", uri=True) as db:
        experiment = db.execute("SELECT artifact_location FROM experiments WHERE name = 'ui-exp'").fetchall()
        return [row[0] for row in experiment + db.execute("SELECT artifact_uri FROM runs").fetchall()]


def test_ui_on_a_copy_points_the_copys_store_at_its_own_artifacts(original: Path, tmp_path: Path, monkeypatch):
    copy = copy_of(original, tmp_path / "copy")
    before = artifact_locations(original)
    assert all(location.startswith((original / "dapo-runs").as_uri()) for location in before)
    asked: list[list[str]] = []
    monkeypatch.setattr(run_cmd, "serve", lambda command: asked.append(command) or 0)
    monkeypatch.chdir(copy)
    result = CliRunner().invoke(app, ["ui", "spec.yaml", "--port", "5056"])
    assert result.exit_code == 0, result.output
    assert len(asked) == 1 and "sqlite:///dapo-runs/mlflow.db" in asked[0]  # the copy's store (cwd: the copy)
    after = artifact_locations(copy)
    assert len(after) == 1 + 1 + len(CHILDREN)  # experiment, parent, children
    assert all(location.startswith((copy / "dapo-runs" / "mlartifacts").as_uri()) for location in after)
    assert artifact_locations(original) == before  # the original is not touched


# -- the real server in a real browser ------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, server: subprocess.Popen, timeout: float = 180) -> None:
    """Until the server accepts connections (polled), failing at once if it exits."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if server.poll() is not None:
            raise AssertionError(f"`dapo-ablate ui` exited with {server.returncode}: {server.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens on port {port} after {timeout} s")
        time.sleep(0.2)


def stop(server: subprocess.Popen) -> None:
    """SIGTERM `dapo-ablate ui` (it stops the MLflow server it started); SIGKILL what is left."""
    started = descendants([server.pid])
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=60)
    finally:
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe: JSON messages ended by a NUL
    byte, Chromium reading commands from its fd 3 and writing replies and events to its fd 4."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]

    def __init__(self, profile: Path) -> None:
        its_input, self._commands = map(_high_fd, os.pipe())
        self._replies, its_output = map(_high_fd, os.pipe())
        # the shell puts the two pipe ends on fds 3 and 4, then becomes Chromium
        shell = f'exec "$0" "$@" 3<&{its_input} 4>&{its_output} {its_input}<&- {its_output}>&-'
        self.process = subprocess.Popen(
            ["bash", "-c", shell, str(CHROMIUM), *self.FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe"],
            pass_fds=(its_input, its_output), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        os.close(its_input)
        os.close(its_output)
        self._buffer, self._last_id = b"", 0

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events in between are skipped)."""
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._replies, 1 << 16)
                if not chunk:
                    raise AssertionError(f"chromium stopped: {self.process.stderr.read().decode()[-2000:]}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._last_id:
                assert "error" not in reply, (method, reply["error"])
                return reply["result"]

    def evaluate_on(self, url: str, script: str) -> Any:
        """Open `url` in a new tab and return the value of `script` (a promise is awaited)."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.navigate", session, url=url)  # returns once the new document is committed
        result = self.call("Runtime.evaluate", session, expression=script, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close")
        finally:
            for fd in (self._commands, self._replies):
                os.close(fd)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _high_fd(fd: int) -> int:
    """`fd` moved to 10 or above (close-on-exec), clear of the 3 and 4 Chromium's pipe needs."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


# Waits for the parent's row, expands it (its first button), waits for the children's names and
# returns the page's text; the waits poll the page (the 60 s limits only bound a broken page).
EXPAND_AND_READ = """(async () => {
  const until = async (test, ms) => {
    for (const end = Date.now() + ms; Date.now() < end; await new Promise(r => setTimeout(r, 100))) {
      const value = test(); if (value) return value;
    }
    return null;
  };
  const expander = await until(() => document.querySelector('[row-id="%(parent)s"] button'), 60000);
  if (!expander) return "no row for the parent run; the page says: " + document.body.innerText;
  expander.click();
  await until(() => %(children)s.every(name => document.body.innerText.includes(name)), 60000);
  return document.body.innerText;
})()"""


@pytest.mark.skipif(
    not CHROMIUM.exists() and os.environ.get("CI") != "true",
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium; .ci/run installs it under CI=true)",
)
def test_mlflow_ui_in_headless_chromium_shows_the_training_runs_of_the_copy(original: Path, tmp_path: Path):
    copy = copy_of(original, tmp_path / "copy")
    shutil.rmtree(original / "dapo-runs" / "mlartifacts")  # the copy must stand on its own artifacts
    port = free_port()
    server = subprocess.Popen([COMMAND, "ui", "spec.yaml", "--port", str(port)], cwd=copy,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_port(port, server)
        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{copy / 'dapo-runs' / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("ui-exp")
        runs = {run.info.run_name: run.info.run_id for run in client.search_runs([experiment.experiment_id])}
        assert set(runs) == {"ui-exp", *CHILDREN}

        # the served artifacts are the copy's (the original's are gone)
        query = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/artifacts/list?run_id={runs['CH s0']}"
        listing = json.loads(urllib.request.urlopen(query, timeout=60).read())
        assert listing["root_uri"].startswith((copy / "dapo-runs").as_uri())
        assert [entry["path"] for entry in listing["files"]] == ["config.json"]

        browser = Chromium(tmp_path / "profile")
        try:
            text = browser.evaluate_on(
                f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs",
                EXPAND_AND_READ % {"parent": runs["ui-exp"], "children": json.dumps(CHILDREN)},
            )
        finally:
            browser.close()
    finally:
        stop(server)
    lines = text.splitlines()
    assert "Training runs" in lines, text  # the experiment-kind tag opens it on training, not GenAI
    assert "ui-exp" in lines and all(name in lines for name in CHILDREN), text
    assert f"{1 + len(CHILDREN)} matching runs" in text
