"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_ui.py
describes; its docstring says what they check."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.runtime.reaper import descendants, kill_session
from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
from dapo_ablate.ablation.store.runs_view import RUNS_VIEW_KEY, SHARED_VIEW_PREFIX
from dapo_ablate.cli import run_cmd
from dapo_ablate.cli.main import app

from support import free_port, pythonpath_with_tests

COMMAND = str(Path(sys.executable).parent / "dapo-ablate")


CHROMIUM = Path("/usr/bin/chromium")

HANG_GUARD_S = 900

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
    environment = {**os.environ, CELL_FN_ENV: "test_ui_e2e:finished_cell",
                   "PYTHONPATH": pythonpath_with_tests()}
    process = subprocess.Popen([COMMAND, "run", "spec.yaml", "--no-progress"], cwd=folder, env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=HANG_GUARD_S)
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


def view_tags(folder: Path) -> list[str]:
    """The shared views of the experiment in folder's MLflow store."""
    with sqlite3.connect(f"file:{folder / 'dapo-runs' / 'mlflow.db'}?mode=ro", uri=True) as db:
        return [row[0] for row in db.execute(
            "SELECT key FROM experiment_tags JOIN experiments USING (experiment_id) WHERE name = 'ui-exp' AND key LIKE ?",
            (SHARED_VIEW_PREFIX + "%",))]


def ui_until_it_exits(folder: Path, port: int, **environment: str) -> subprocess.CompletedProcess:
    """`dapo-ablate ui spec.yaml --port PORT` in `folder`, to its end (whatever it started, stopped)."""
    process = subprocess.Popen([COMMAND, "ui", "spec.yaml", "--port", str(port)], cwd=folder, env={**os.environ, **environment},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=HANG_GUARD_S)  # its exit is the event
    finally:
        kill_session(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


# -- the real server in a real browser ------------------------------------------------------------
def stop(server: subprocess.Popen) -> None:
    """SIGTERM `dapo-ablate ui` (it stops the MLflow server it started); SIGKILL what is left."""
    started = descendants([server.pid])
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:  # cleanup, not a check: the test has what it needs
        server.kill()
        server.wait()
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

    def evaluate_on(self, url: str, script: str, screenshot: Path | None = None) -> Any:
        """Open `url` in a new tab of a 1600 x 1000 window and return the value of `script` (a
        promise is awaited); with `screenshot`, save what the tab shows then as a PNG there."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", session, width=1600, height=1000, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", session, url=url)  # returns once the new document is committed
        result = self.call("Runtime.evaluate", session, expression=script, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        if screenshot is not None:
            screenshot.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", session, format="png")["data"]))
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


class Output:
    """What a process writes to its stdout and stderr, read by a thread per pipe as it comes (an
    unread pipe would fill and stall the MLflow server that shares it)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.lines, self.errors = process, queue.Queue(), []
        threading.Thread(target=self._read, args=(process.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._read, args=(process.stderr, self.errors.append), daemon=True).start()
        self.printed: list[str] = []

    @staticmethod
    def _read(stream: Any, keep: Any) -> None:
        for line in stream:
            keep(line.rstrip("\n"))
        keep(None)

    def until(self, test: Any, limit_s: float = HANG_GUARD_S) -> list[str]:
        """stdout's lines up to the first that passes `test`; fails if stdout ends first (the
        process exited). `limit_s` only bounds a server that hangs."""
        while True:
            try:
                line = self.lines.get(timeout=limit_s)
            except queue.Empty:
                raise AssertionError(f"no such line in {limit_s} s; printed: {self.printed}") from None
            if line is None:
                raise AssertionError(f"`dapo-ablate ui` exited ({self.process.wait()}): {self.printed} {self.errors[-20:]}")
            self.printed.append(line)
            if test(line):
                return self.printed

    def rest(self) -> list[str]:
        """All of stdout, once the process has ended."""
        while (line := self.lines.get(timeout=HANG_GUARD_S)) is not None:  # the pipe's end is the event
            self.printed.append(line)
        return self.printed


# Waits until the runs table shows every run's row and the view's columns and no loading overlay is
# shown (the waits poll the page; the 300 s limits only bound a broken page) and returns the page's
# address, text, column ids, and each row's cells by column id and its place among the rows (the
# columns in the order shown).
READ_RUNS_TABLE = """(async () => {
  const until = async (test, ms) => {
    for (const end = Date.now() + ms; Date.now() < end; await new Promise(r => setTimeout(r, 100))) {
      const value = document.body && test(); if (value) return value;
    }
    return null;
  };
  const rowIds = () => [...new Set([...document.querySelectorAll('.ag-row[row-id]')].map(row => row.getAttribute('row-id')))];
  const columnIds = () => [...new Set([...document.querySelectorAll('.ag-header-cell[col-id]')]  // left to right as shown
    .sort((a, b) => a.getBoundingClientRect().left - b.getBoundingClientRect().left).map(cell => cell.getAttribute('col-id')))];
  await until(() => %(runs)s.every(id => rowIds().includes(id)) && %(columns)s.every(id => columnIds().includes(id)), 300000);
  // the grid keeps its loading overlay in the page, hidden, once the rows are in: wait for none shown
  await until(() => ![...document.querySelectorAll('.ag-overlay-loading-wrapper')].some(e => e.offsetParent !== null), 300000);
  const rows = {};
  for (const cell of document.querySelectorAll('.ag-row[row-id] .ag-cell[col-id]')) {
    const row = cell.closest('.ag-row');
    const id = row.getAttribute('row-id');
    rows[id] = rows[id] || {index: Number(row.getAttribute('row-index')), cells: {}};
    rows[id].cells[cell.getAttribute('col-id')] = cell.innerText.trim();
  }
  return {href: location.href, text: document.body.innerText, columns: columnIds(), rows: rows};
})()"""


def test_ui_on_a_copy_points_the_copys_store_at_its_own_artifacts(original: Path, tmp_path: Path, monkeypatch):
    copy = copy_of(original, tmp_path / "copy")
    before = artifact_locations(original)
    assert all(location.startswith((original / "dapo-runs").as_uri()) for location in before)
    asked: list[list[str]] = []
    monkeypatch.setattr(run_cmd, "serve", lambda command, running=None: asked.append(command) or 0)  # 0: the user stopped it
    monkeypatch.chdir(copy)
    result = CliRunner().invoke(app, ["ui", "spec.yaml", "--port", "5056"])
    assert result.exit_code == 0, result.output
    assert len(asked) == 1 and f"sqlite:///{copy / 'dapo-runs' / 'mlflow.db'}" in asked[0]  # the copy's store
    after = artifact_locations(copy)
    assert len(after) == 1 + 1 + len(CHILDREN)  # experiment, parent, children
    assert all(location.startswith((copy / "dapo-runs" / "mlartifacts").as_uri()) for location in after)
    assert artifact_locations(original) == before  # the original is not touched
    assert view_tags(copy) == [f"{SHARED_VIEW_PREFIX}{RUNS_VIEW_KEY}"] and view_tags(original) == []


def test_ui_refuses_a_port_in_use_before_it_writes_or_starts_anything(original: Path, tmp_path: Path):
    copy = copy_of(original, tmp_path / "copy")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = ui_until_it_exits(copy, port)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: port {port} on 127.0.0.1 is not free (Address already in use); choose another with --port"]
    assert done.stdout == "" and view_tags(copy) == []


def test_ui_says_so_in_one_sentence_when_the_server_stops_before_it_answers(original: Path, tmp_path: Path):
    copy = copy_of(original, tmp_path / "copy")
    port = free_port()
    done = ui_until_it_exits(copy, port, UVICORN_LOG_LEVEL="nonsense")  # MLflow's uvicorn refuses to start; `mlflow ui` exits 0
    assert done.returncode == 2, done.stderr
    assert "Invalid value for '--log-level'" in done.stderr  # the server's own message stays in view, above
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: the MLflow server stopped before it answered on 127.0.0.1:{port}; its own messages above say why")
    assert "waiting until it answers" in done.stdout and "://" not in done.stdout


@pytest.mark.skipif(
    not CHROMIUM.exists() and os.environ.get("CI") != "true",
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium; .ci/run installs it under CI=true)",
)
def test_ui_prints_one_link_that_opens_the_training_runs_table_of_the_copy(original: Path, tmp_path: Path):
    copy = copy_of(original, tmp_path / "copy")
    shutil.rmtree(original / "dapo-runs" / "mlartifacts")  # the copy must stand on its own artifacts
    port = free_port()
    server = subprocess.Popen([COMMAND, "ui", "spec.yaml", "--port", str(port)], cwd=copy,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    output = Output(server)
    try:
        printed = output.until(lambda line: "://" in line)
        assert any(line.startswith("Starting the MLflow UI of ui-exp: waiting until it answers on") for line in printed)
        link = printed[-1]
        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{copy / 'dapo-runs' / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("ui-exp")
        runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
        assert set(runs) == {"ui-exp", *CHILDREN}
        assert link == (f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs"
                        "?workflowType=machine_learning&viewStateShareKey=dapo-ablate")

        # it answers once the link is printed; the served artifacts are the copy's (the original's are gone)
        query = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/artifacts/list?run_id={runs['CH s0'].info.run_id}"
        listing = json.loads(urllib.request.urlopen(query, timeout=HANG_GUARD_S).read())
        assert listing["root_uri"].startswith((copy / "dapo-runs").as_uri())
        assert [entry["path"] for entry in listing["files"]] == ["config.json"]

        metric, factors = "metrics.`val-core/builtin/acc/mean_at_4`", ["params.`factor.overlong_filter`", "params.`factor.clip_higher`"]
        in_pp = "tags.`val-core/builtin/acc/mean_at_4 in pp`"
        headline = "metrics.`headline/full_vs_baseline`"
        browser = Chromium(tmp_path / "profile")
        try:
            page = browser.evaluate_on(link, READ_RUNS_TABLE % {
                "runs": json.dumps([run.info.run_id for run in runs.values()]),
                "columns": json.dumps([in_pp, *factors, headline]),
            }, screenshot=tmp_path / "runs-table.png")
        finally:
            browser.close()
        # the server's start-up INFO lines and its dependencies' deprecation warnings stay off the console
        assert not [line for line in output.errors if line and ("INFO" in line or "Warning" in line)], output.errors
    finally:
        stop(server)
    print(f"screenshot: {tmp_path / 'runs-table.png'}")
    assert [line for line in output.rest() if "://" in line] == [link]  # one link, and no access log

    # the Model training pages, not the GenAI ones
    lines = page["text"].splitlines()
    assert "Runs" in lines and "Model registry" in lines, page["text"]
    assert not {"Training runs", "Evaluation runs", "Sessions", "Judges", "Detect issues"} & set(lines), page["text"]
    facets = urllib.parse.parse_qs(urllib.parse.urlsplit(page["href"].split("#", 1)[1]).query)
    assert facets["workflowType"] == ["machine_learning"] and facets["orderByKey"] == [metric], page["href"]

    # every run a row of its own, ranked by the metric; its metric and factor levels in the view's columns
    # the metric in pp (the fraction stays on each run's page), ranking the rows
    assert [in_pp, *factors, headline] == [column for column in page["columns"] if column in (in_pp, metric, *factors, headline)]
    rows = {name: page["rows"].get(run.info.run_id) for name, run in runs.items()}
    assert all(rows.values()), (page["rows"], page["text"])
    for name in CHILDREN:
        params = runs[name].data.params
        shown = rows[name]["cells"]
        assert shown[in_pp] == f"{100 * runs[name].data.metrics['val-core/builtin/acc/mean_at_4']:.1f}", (name, shown)  # 75.0, not 0.75
        assert [shown[column] for column in factors] == [params["factor.overlong_filter"], params["factor.clip_higher"]]
    ranked = sorted(CHILDREN, key=lambda name: rows[name]["index"])
    assert {*ranked[:2]} == {"CH s0", "OF+CH s0"}  # 0.75 before 0.25
    gain = runs["ui-exp"].data.metrics["headline/full_vs_baseline"]
    assert rows["ui-exp"]["cells"][headline] == f"{gain:g}" and rows["ui-exp"]["index"] == len(CHILDREN)  # the parent, last
    assert f"{1 + len(CHILDREN)} matching runs" in page["text"]


def test_ui_prints_no_link_when_another_program_takes_the_port_during_its_start(original: Path, tmp_path: Path):
    """Another program binds the port after `ui` checked it and before MLflow's server does (the
    test binds it on `ui`'s "waiting" line, while MLflow is still importing) and answers every
    request with 200: `ui` prints no link to it and says so in one sentence, exit 2."""
    import http.server

    class Impostor(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b'{"experiment": {"tags": []}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    copy = copy_of(original, tmp_path / "copy")
    port = free_port()
    process = subprocess.Popen([COMMAND, "ui", "spec.yaml", "--port", str(port)], cwd=copy,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    impostor = None
    try:
        first = process.stdout.readline()
        assert first.startswith("Starting the MLflow UI of ui-exp: waiting until it answers on"), first
        impostor = http.server.HTTPServer(("127.0.0.1", port), Impostor)
        threading.Thread(target=impostor.serve_forever, daemon=True).start()
        out, err = process.communicate(timeout=HANG_GUARD_S)  # its exit is the event
    finally:
        kill_session(process.pid)
        if impostor is not None:
            impostor.shutdown()
            impostor.server_close()
    assert process.returncode == 2, err
    assert err.strip().splitlines()[-1] == (
        f"error: something else answers on 127.0.0.1:{port}, not the MLflow UI of this store (another program took the "
        "port while the server started); the link was not printed: choose another with --port")
    assert "://" not in first + out
