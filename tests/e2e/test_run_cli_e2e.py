"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_run_cli.py
describes; its docstring says what they check."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.runtime.reaper import kill_session
from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.ablation.store.tracking import RUN_ID_TAG
from dapo_ablate.cli import run_cmd
from dapo_ablate.cli.main import app

from support import HANG_GUARD_S, pythonpath_with_tests
from test_run_cli import write_spec  # noqa: F401, F811 - shared with the fast part

COMMAND = str(Path(sys.executable).parent / "dapo-ablate")


def sleepy_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """Sleeps $CELL_SLEEP_S, records the call, and returns a result stamped with the time."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / "calls", "a") as handle:
        handle.write(f"{time.time()}\n")
    time.sleep(float(os.environ.get("CELL_SLEEP_S", "1")))
    techniques = config["techniques"]
    if os.environ.get("FAIL_CH_CELL") and techniques["clip_higher"] and not techniques["overlong_filter"]:
        raise ValueError("the CH cell fails on purpose")
    return {
        "metrics": {"avg@32": 0.25 + 0.5 * techniques["clip_higher"], "finished_at": time.time()},
        "eval_curve": [{"step": 0, "avg@32": 0.25}], "signals": [{"step": 1, "reward": 0.5}], "wall_s": 1.0,
    }


def start(spec_path: Path, *args: str, sleep_s: float, **env: str) -> subprocess.Popen:
    """`dapo-ablate run SPEC --no-progress` in its own session, with `sleepy_cell`."""
    environment = {
        **os.environ, CELL_FN_ENV: "test_run_cli_e2e:sleepy_cell", "CELL_SLEEP_S": str(sleep_s),
        "PYTHONPATH": pythonpath_with_tests(), **env,
    }
    return subprocess.Popen(
        [COMMAND, "run", str(spec_path), "--no-progress", *args], cwd=spec_path.parent, env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def finish(process: subprocess.Popen, timeout: float = HANG_GUARD_S) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        kill_session(process.pid)
    return process.returncode, out, err


def status_counts(spec_path: Path) -> dict[str, int]:
    """Run status -> count, read without locking or creating anything (empty before the ledger)."""
    path = spec_path.parent / "out" / "ledger.db"
    if not path.is_file():
        return {}
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            return dict(connection.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
    except sqlite3.Error:  # the driver is still creating the schema
        return {}


def wait_for(spec_path: Path, process: subprocess.Popen, status: str, at_least: int, timeout: float = HANG_GUARD_S) -> None:
    deadline = time.time() + timeout
    while status_counts(spec_path).get(status, 0) < at_least:
        if process.poll() is not None:
            raise AssertionError(f"the driver exited early: {process.communicate()}")
        if time.time() > deadline:
            raise AssertionError(f"no {at_least} {status} runs within {timeout} s: {status_counts(spec_path)}")
        time.sleep(0.2)


def ledger_state(spec_path: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """(runs table by run id, results by run id) of the experiment."""
    with SQLLedger(f"sqlite:///{spec_path.parent / 'out' / 'ledger.db'}") as ledger:
        runs = {row["run_id"]: row for row in ledger.runs_table("cli-exp")}
        results = {row["run_id"]: row for row in ledger.results("cli-exp")}
    return runs, results


def calls(spec_path: Path, run_id: str) -> int:
    path = spec_path.parent / "out" / "cli-exp" / run_id / "calls"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def mlflow_runs(spec_path: Path) -> tuple[list[Any], dict[str, list[Any]]]:
    """(parent runs, ledger run id -> active child runs) of the experiment."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{spec_path.parent / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cli-exp")
    runs = client.search_runs([experiment.experiment_id])
    children: dict[str, list[Any]] = {}
    for run in runs:
        if RUN_ID_TAG in run.data.tags:
            children.setdefault(run.data.tags[RUN_ID_TAG], []).append(run)
    return [run for run in runs if RUN_ID_TAG not in run.data.tags], children


def without_mlflow_id(result: dict) -> dict:
    return {key: value for key, value in result.items() if key != "mlflow_run_id"}


def wait_started(spec_path: Path, process: subprocess.Popen, at_least: int) -> None:
    """Until `at_least` cell functions have started inside Ray (each writes its run's `calls`)."""
    while len(list((spec_path.parent / "out").glob("*/*/calls"))) < at_least:
        if process.poll() is not None:
            raise AssertionError(f"the driver exited early: {process.communicate()}")
        time.sleep(0.2)


# -- resume after SIGKILL, failures, Ctrl-C ------------------------------------------------------
@pytest.mark.slow
def test_sigkill_then_rerun_finishes_every_run_exactly_once(tmp_path: Path):
    spec_path = write_spec(tmp_path, seeds=3)  # 12 runs, 2 at a time, ~1.5 s each
    driver = start(spec_path, sleep_s=1.5)
    wait_for(spec_path, driver, "done", at_least=4)
    driver.send_signal(signal.SIGKILL)
    finish(driver)
    runs, before = ledger_state(spec_path)
    assert 4 <= len(before) < 12
    assert any(row["status"] == "running" for row in runs.values())  # claims of the dead driver

    code, out, err = finish(start(spec_path, sleep_s=0.2))
    assert code == 0, err
    runs, after = ledger_state(spec_path)
    assert len(runs) == 12 and all(row["status"] == "done" for row in runs.values())
    for run_id, result in before.items():  # recorded before the kill: unchanged, never rerun
        assert without_mlflow_id(after[run_id]) == without_mlflow_id(result)
        assert calls(spec_path, run_id) == 1
    parents, children = mlflow_runs(spec_path)
    assert len(parents) == 1
    assert set(children) == set(runs)
    assert all(len(found) == 1 and found[0].info.status == "FINISHED" for found in children.values())
    assert {run_id: row["mlflow_run_id"] for run_id, row in runs.items()} == {
        run_id: found[0].info.run_id for run_id, found in children.items()
    }


@pytest.mark.slow
def test_two_drivers_started_together_on_a_new_store_share_one_parent_and_train_each_run_once(tmp_path: Path):
    spec_path = write_spec(tmp_path, seeds=2)  # 8 runs; the MLflow store and ledger do not exist yet
    first, second = start(spec_path, sleep_s=0.5), start(spec_path, sleep_s=0.5)
    results = [finish(first, timeout=600), finish(second, timeout=600)]  # safety nets, not budgets
    # the driver that ends first may leave runs the other still trains ("not finished", exit 1)
    assert sorted(code for code, _, _ in results) in ([0, 0], [0, 1]), [err[-1500:] for _, _, err in results]
    assert not any("Traceback" in err or "error:" in err for _, _, err in results)
    runs, _ = ledger_state(spec_path)
    assert len(runs) == 8 and all(row["status"] == "done" for row in runs.values())
    assert {run_id: calls(spec_path, run_id) for run_id in runs} == {run_id: 1 for run_id in runs}
    parents, children = mlflow_runs(spec_path)
    assert len(parents) == 1  # found-or-created under the experiment's lock, not searched then created twice
    assert set(children) == set(runs) and all(len(found) == 1 for found in children.values())


def test_ray_processes_started_by_a_driver_die_with_it_after_sigkill(tmp_path: Path):
    from dapo_ablate.ablation.runtime.reaper import _start_time, descendants

    spec_path = write_spec(tmp_path)
    driver = start(spec_path, sleep_s=600)
    wait_for(spec_path, driver, "running", at_least=2)
    wait_started(spec_path, driver, at_least=2)
    started = [(pid, _start_time(pid)) for pid in descendants([driver.pid]) if pid != driver.pid]
    assert len(started) >= 4  # GCS, raylet, agents, workers (and the watchdog)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    try:
        deadline = time.time() + HANG_GUARD_S  # a safety net for a broken watchdog, not a time budget
        while any(_start_time(pid) == start for pid, start in started) and time.time() < deadline:
            time.sleep(0.2)
        left = [pid for pid, start in started if _start_time(pid) == start]
        assert not left, f"still alive after the driver died: {left}"
    finally:
        kill_session(driver.pid)


@pytest.mark.slow
def test_a_failing_run_fails_the_command_and_retry_failed_retries_only_it(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    code, out, err = finish(start(spec_path, sleep_s=0.1, FAIL_CH_CELL="1"))
    assert code == 1
    assert "failed CH s0: ValueError: the CH cell fails on purpose (at test_run_cli_e2e.py:" in err
    runs, _ = ledger_state(spec_path)
    (failed,) = [row for row in runs.values() if row["status"] == "failed"]
    assert failed["error"].startswith("ValueError: the CH cell fails on purpose") and failed["attempts"] == 2
    assert sum(row["status"] == "done" for row in runs.values()) == 3

    validated = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert "ledger   3 done, 1 failed: 1 of 4 runs still to do" in validated.output, validated.output

    code, out, err = finish(start(spec_path, sleep_s=0.1))  # attempts count across invocations
    assert code == 1 and "failed CH s0" in err
    assert calls(spec_path, failed["run_id"]) == 2

    code, out, err = finish(start(spec_path, "--retry-failed", sleep_s=0.1))
    assert code == 0, err
    runs, _ = ledger_state(spec_path)
    assert all(row["status"] == "done" for row in runs.values())
    assert {run_id: calls(spec_path, run_id) for run_id in runs} == {
        run_id: 3 if run_id == failed["run_id"] else 1 for run_id in runs
    }
    _, children = mlflow_runs(spec_path)
    assert all(len(found) == 1 for found in children.values()) and len(children) == 4
    validated = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert "ledger   all 4 runs done: nothing to run" in validated.output, validated.output


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_cancels_runs_in_flight_and_leaves_them_pending(tmp_path: Path, signum: int, code: int):
    """Ctrl-C (SIGINT to the session) and SIGTERM (to the driver, as a scheduler or `kill`
    sends it) are the same clean cancel; only the exit status differs (128 + signal)."""
    spec_path = write_spec(tmp_path)
    driver = start(spec_path, sleep_s=600)
    wait_for(spec_path, driver, "running", at_least=2)
    wait_started(spec_path, driver, at_least=2)  # the tasks run inside Ray: an event, not a pause
    if signum == signal.SIGINT:
        os.killpg(driver.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    else:
        os.kill(driver.pid, signal.SIGTERM)
    returned, out, err = finish(driver, timeout=600)  # a safety net for a hung driver, not a time budget
    assert returned == code, err
    assert "interrupted" in err and "Traceback" not in err
    assert "runs done" in out  # the summary is printed
    runs, _ = ledger_state(spec_path)
    assert all(row["status"] == "pending" and row["attempts"] == 0 for row in runs.values())
    parents, children = mlflow_runs(spec_path)
    assert parents[0].info.status == "KILLED"
    # live tracking: the runs in flight had RUNNING children, now KILLED, one per run, and no other
    assert children and all(len(found) == 1 and found[0].info.status == "KILLED" for found in children.values())


def test_ui_serves_the_experiments_store_on_localhost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec_path = write_spec(tmp_path)
    asked: list[list[str]] = []
    monkeypatch.setattr(run_cmd, "serve", lambda command, running=None: asked.append(command) or 0)
    result = CliRunner().invoke(app, ["ui", str(spec_path), "--port", "5055"])
    assert result.exit_code == 2 and "no MLflow store" in result.stderr and not asked
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mlflow.db").write_bytes(b"")
    result = CliRunner().invoke(app, ["ui", str(spec_path), "--port", "5055"])
    assert result.exit_code == 0, result.output
    (command,) = asked
    assert command[1:] == ["-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{tmp_path}/out/mlflow.db",
                           "--host", "127.0.0.1", "--port", "5055", "--workers", "1"]
