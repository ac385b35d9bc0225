"""``dapo-ablate run | validate | status | ui``: the command as a user runs it.

The slow tests start ``dapo-ablate run`` as a subprocess with a cheap-but-not-instant cell
function chosen through ``DAPO_ABLATE_CELL_FN=test_run_cli:<function>`` (this module is put on
the PYTHONPATH of the driver and, through it, of its Ray workers), then kill, interrupt or
rerun it and read the ledger and MLflow it left.
"""

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
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.ablation.runtime.reaper import kill_session
from dapo_ablate.ablation.store.tracking import RUN_ID_TAG
from dapo_ablate.cli import run_cmd
from dapo_ablate.cli.main import app

COMMAND = str(Path(sys.executable).parent / "dapo-ablate")
TESTS = Path(__file__).resolve().parent


# -- cell functions (they run in the Ray workers of a `dapo-ablate run` subprocess) -------------
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


# -- helpers -----------------------------------------------------------------------------------
def write_spec(tmp_path: Path, **fields: Any) -> Path:
    out = tmp_path / "out"
    data = {
        "name": "cli-exp", "trainer": {"rollout": {"max_response_len": 64}, "algorithm": {"overlong_cache": 8}}, "factors": ["overlong_filter", "clip_higher"], "seeds": 1,
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db",
        "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
        "executor": {"retries": 1, "max_concurrent": 2, "lease_s": 600},
    }
    data.update(fields)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def start(spec_path: Path, *args: str, sleep_s: float, **env: str) -> subprocess.Popen:
    """`dapo-ablate run SPEC --no-progress` in its own session, with `sleepy_cell`."""
    environment = {
        **os.environ, CELL_FN_ENV: "test_run_cli:sleepy_cell", "CELL_SLEEP_S": str(sleep_s),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **env,
    }
    return subprocess.Popen(
        [COMMAND, "run", str(spec_path), "--no-progress", *args], cwd=spec_path.parent, env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
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


def wait_for(spec_path: Path, process: subprocess.Popen, status: str, at_least: int, timeout: float = 180) -> None:
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
        deadline = time.time() + 300  # a safety net for a broken watchdog, not a time budget
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
    assert "failed CH s0: ValueError: the CH cell fails on purpose (at test_run_cli.py:" in err
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


def wait_started(spec_path: Path, process: subprocess.Popen, at_least: int) -> None:
    """Until `at_least` cell functions have started inside Ray (each writes its run's `calls`)."""
    while len(list((spec_path.parent / "out").glob("*/*/calls"))) < at_least:
        if process.poll() is not None:
            raise AssertionError(f"the driver exited early: {process.communicate()}")
        time.sleep(0.2)


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


# -- mistakes: exit 2, one sentence, nothing written -------------------------------------------
def _file_in(tmp_path: Path) -> str:
    (tmp_path / "a-file").write_text("")
    return str(tmp_path / "a-file" / "runs")


BAD_SPECS = {
    "unknown key": ({"bogus": 1}, "unknown key `bogus`"),
    "unknown factor": ({"factors": ["warp_drive"]}, "unknown factor 'warp_drive'"),
    "no factors": ({"factors": []}, "factors"),
    "seeds below 1": ({"seeds": 0}, "seeds"),
    "impossible fraction": ({"design": "fractional", "factors": ["overlong_filter", "clip_higher"]}, "design"),
    "unreachable Ray address": ({"executor": {"address": "127.0.0.1:1"}}, "cannot reach the Ray cluster at 127.0.0.1:1"),
    "unwritable output folder": ({"output_dir": "FILE"}, "is a file"),
    "unreachable ledger": ({"ledger": "postgresql://postgres@127.0.0.1:1/nowhere"}, "could not connect to the ledger"),
    "more CPUs per run than here": ({"executor": {"cpus_per_run": 4096}}, "cpus_per_run"),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_bad_specs_exit_2_with_one_sentence_and_write_nothing(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    fields, expected = BAD_SPECS[case]
    if fields.get("output_dir") == "FILE":
        fields = {"output_dir": _file_in(tmp_path)}
    spec_path = write_spec(tmp_path, **fields)
    before = sorted(tmp_path.rglob("*"))
    result = CliRunner().invoke(app, ["run", str(spec_path), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(tmp_path.rglob("*")) == before


def test_unreachable_address_option_and_missing_spec_exit_2(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    result = CliRunner().invoke(app, ["run", str(spec_path), "--address", "127.0.0.1:1"])
    assert result.exit_code == 2 and "cannot reach the Ray cluster" in result.stderr
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


# -- validate, status, ui ----------------------------------------------------------------------
def test_validate_and_dry_run_print_the_plan_and_write_nothing(tmp_path: Path):
    spec_path = write_spec(tmp_path, seeds=2)
    for args in (["validate", str(spec_path)], ["run", str(spec_path), "--dry-run"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "8 = 4 unique cells x 2 seeds" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_status_before_any_run_lists_new_runs_and_writes_nothing(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    result = CliRunner().invoke(app, ["status", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "OF+CH" in result.stdout and "new 4" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_status_shows_errors_and_metrics(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import load_spec

    spec = load_spec(spec_path)
    plan = expand(spec)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        first, second = plan.runs[0].run_id, plan.runs[1].run_id
        ledger.claim(first, "here:1")
        ledger.finish(first, {"metrics": {"avg@32": 0.4375}, "wall_s": 12.5})
        ledger.claim(second, "here:1")
        ledger.fail(second, "ValueError: boom (at cell.py:3 in f)")
    result = CliRunner().invoke(app, ["status", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "43.8" in result.stdout and "(pp)" in result.stdout and "12.5 s" in result.stdout and "ValueError: boom" in result.stdout
    assert "new 0  pending 2  running 0  done 1  failed 1" in result.stdout


def test_ui_serves_the_experiments_store_on_localhost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec_path = write_spec(tmp_path)
    asked: list[list[str]] = []
    monkeypatch.setattr(run_cmd, "serve", lambda command: asked.append(command) or 0)
    result = CliRunner().invoke(app, ["ui", str(spec_path), "--port", "5055"])
    assert result.exit_code == 2 and "no MLflow store" in result.stderr and not asked
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mlflow.db").write_bytes(b"")
    result = CliRunner().invoke(app, ["ui", str(spec_path), "--port", "5055"])
    assert result.exit_code == 0, result.output
    (command,) = asked
    assert command[1:] == ["-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{tmp_path}/out/mlflow.db",
                           "--host", "127.0.0.1", "--port", "5055", "--workers", "1"]


def test_report_on_an_experiment_without_results_exits_2_and_writes_nothing(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    result = CliRunner().invoke(app, ["report", str(spec_path), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrainer: {}\nfactorz: [clip_higher]\n")
    result = CliRunner().invoke(app, ["report", str(bad), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 2 and "factorz" in result.stderr
