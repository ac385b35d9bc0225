"""Hostile input, round three, more members of the same classes: bounded waits on a tracking server
that accepts a connection and then never answers, or answers with a status MLflow retries for
minutes; records beside an experiment's spec (origin.json) that someone else wrote; a ledger's
MLflow parent run id edited to name another run; a running row's heartbeat edited to one no driver
wrote; a runs folder that is a store or the cache; a sweep's Optuna rows edited by hand."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import threading
from datetime import datetime, timezone

import optuna
import pytest
import yaml
from sqlalchemy import create_engine, update
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.identity import RunSpec
from dapo_ablate.ablation.experiment.spec import load_spec, run_root
from dapo_ablate.ablation.runtime.executor import (
    ORIGIN_RECORD,
    read_origin,
    record_spec,
)
from dapo_ablate.ablation.store.database import with_psycopg_driver
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import connect_ledger
from dapo_ablate.ablation.store.ledger_models import Run
from dapo_ablate.ablation.store.tracking import check_server_reachable
from dapo_ablate.cli.main import app
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.spec import build_sweep

from support import HANG_GUARD_S, free_port, record_finished, write_spec
from tiny_configs import TINY_TRAINER


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


@pytest.mark.parametrize("kind", ["folder at the sqlite file's name", "closed postgresql port", "malformed URL"])
def test_a_tracking_store_mlflow_would_retry_for_minutes_is_one_sentence_at_once(tmp_path, kind):
    """MLflow retries a database it cannot open about 100 s (`train --tracking sqlite:////proc/x.db`
    waited that long; a closed PostgreSQL the same), and `http://[::1` was a ValueError traceback."""
    (tmp_path / "store.db").mkdir()
    uri, expected = {
        "folder at the sqlite file's name": (f"sqlite:///{tmp_path / 'store.db'}", "the MLflow tracking store file"),
        "closed postgresql port": (f"postgresql://postgres@127.0.0.1:{free_port()}/mlflow",
                                   "could not connect to the MLflow tracking database at"),
        "malformed URL": ("http://[::1", "is not a URL (Invalid IPv6 URL)"),
    }[kind]
    with pytest.raises(ExecutorError) as refused:
        check_server_reachable(uri, "check --tracking")
    message = str(refused.value)
    assert expected in message and message.endswith("check --tracking") and "\n" not in message


# -- a running row's lease as the ledger holds it -------------------------------------------------
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def held_run(request, tmp_path):
    """A ledger (SQLite, then PostgreSQL) with one run claimed by a driver, and its id."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    with connect_ledger(url) as ledger:
        ledger.ensure_experiment("exp", {"design": "full"})
        ledger.add_runs("exp", [RunSpec("run-0", "0", {"a": 0}, 0, {"lr": 1e-6})])
        assert ledger.claim("run-0", "a:1")
        yield ledger, url


@pytest.mark.parametrize("heartbeat", [None, datetime(9999, 12, 31, tzinfo=timezone.utc)], ids=["missing", "year 9999"])
def test_a_running_row_whose_heartbeat_no_driver_wrote_is_an_expired_lease(held_run, heartbeat):
    """A running row edited to a heartbeat no clock wrote (none, or in the far future) held its run
    for ever: `run` said another driver would finish it and exited without training it."""
    ledger, url = held_run
    engine = create_engine(with_psycopg_driver(url))
    with engine.begin() as connection:
        connection.execute(update(Run).where(Run.run_id == "run-0").values(heartbeat_at=heartbeat, host="other:2"))
    engine.dispose()
    assert ledger.expired_leases("exp") == ["run-0"]
    assert ledger.claimable("exp") == ["run-0"]
    assert ledger.claim("run-0", "b:3") and ledger.runs_table("exp")[0]["host"] == "b:3"


def test_a_live_lease_still_holds(held_run):
    ledger, _ = held_run
    assert ledger.heartbeat("run-0", "a:1")
    assert ledger.expired_leases("exp") == [] and ledger.claimable("exp") == []


# -- names whose runs folder is another thing the product keeps in the output folder ---------------
@pytest.mark.parametrize("name, what", [
    ("ledger.db", "the `ledger` database's file"),
    ("ledger.db.lock", "the `ledger` database's lock file"),
    ("mlflow.db-wal", "the `tracking.uri` database's wal file"),
    ("eval-cache", "the evaluation cache every run of this output folder shares"),
    ("mlartifacts", "MLflow's artifact folder"),
])
def test_a_name_whose_runs_folder_is_a_store_or_the_cache_is_refused(tmp_path, name, what):
    """`name: ledger.db` passed validate and stopped `run` in a FileExistsError traceback (its runs
    folder is the ledger's file); `name: eval-cache` shared the evaluation cache's folder."""
    path = write_spec(tmp_path, name)
    for command in (["validate", str(path)], ["run", str(path), "--dry-run"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        assert f"`name` {name!r} makes the runs folder {str(tmp_path / 'out' / name)!r}, which is {what}" in result.output
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


# -- a sweep's Optuna rows (in the ledger's database) edited by hand ---------------------------------
SWEEP_EDITS = {
    "choice index past the list": ("UPDATE trial_params SET param_value = 7 WHERE param_name = 'overlong_cache'",
                                   "holds a trial row Optuna cannot read (IndexError"),
    "unknown distribution": ("UPDATE trial_params SET distribution_json = '{\"name\": \"Nope\"}'",
                             "holds a trial row Optuna cannot read (ValueError"),
    "knob outside the space": ("UPDATE trial_params SET param_value = 5.0 WHERE param_name = 'eps_high'",
                               "has eps_high = 5.0, outside the sweep's space"),
    "accuracy of 99": ("UPDATE trial_values SET value = 99.0", "has avg@4 = 99.0, but an accuracy is a fraction in [0, 1]"),
}


@pytest.fixture
def swept(tmp_path):
    """A sweep spec whose study (SQLite, the ledger's file) holds one complete trial."""
    data = {"name": "sw", "trainer": TINY_TRAINER, "space": {"eps_high": {"low": 0.2, "high": 0.4},
                                                              "overlong_cache": {"choices": [4, 8]}},
            "n_trials": 1, "sampler": {"type": "random", "seed": 0}, "output_dir": str(tmp_path / "out"),
            "ledger": f"sqlite:///{tmp_path / 'out' / 'ledger.db'}",
            "tracking": {"uri": f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"}}
    (tmp_path / "out").mkdir()
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = build_sweep(data)
    study = studies.open_study(spec, studies.open_storage(spec, heartbeat=False))
    trial = studies.ask(study, spec)
    study.tell(trial, 0.25)
    return path, spec, tmp_path / "out" / "ledger.db"


@pytest.mark.parametrize("edit", list(SWEEP_EDITS))
def test_a_sweeps_trial_row_edited_by_hand_is_one_sentence_naming_it(swept, tmp_path, edit):
    """Each edit was an IndexError or ValueError traceback from sweep and sweep-report, or was
    trusted: the best trial at 9900 pp, or its best setting outside the space."""
    path, spec, ledger = swept
    assert CliRunner().invoke(app, ["sweep-report", str(path), "--out", str(tmp_path / "before")]).exit_code == 0
    statement, expected = SWEEP_EDITS[edit]
    with sqlite3.connect(ledger) as connection:
        connection.execute(statement)
    result = CliRunner().invoke(app, ["sweep-report", str(path), "--out", str(tmp_path / "report")])
    assert result.exit_code == 2, result.output
    assert expected in result.output and "the study 'sw' in" in result.output, result.output
    assert result.output.count("\n") == 1 and not (tmp_path / "report").exists()
    study = optuna.load_study(study_name="sw", storage=studies.open_storage(spec, heartbeat=False))
    with pytest.raises(studies.StudyError, match=re.escape(expected)):
        studies.check_resumable(study, spec)  # what `sweep` runs before it resumes the study


# -- report --out among the experiment's own state ------------------------------------------------
@pytest.mark.parametrize("where, relation", [
    ("out/origin", "is the runs folder"),
    ("out", "is the output folder"),
    (".", "holds the output folder"),
    ("out/eval-cache", "is the evaluation cache"),
    ("out/mlartifacts/report", "is inside MLflow's artifact folder"),
])
def test_report_out_among_the_experiments_own_state_is_refused_before_any_work(recorded, tmp_path, where, relation):
    """`--out OUTPUT_DIR/NAME` replaced the spec record the folder's readers use; `--out .` logged the
    folder with its MLflow artifacts into those artifacts until the names grew too long (OSError)."""
    path, origin = recorded
    spec_record = (origin.parent / "spec.yaml").read_text()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = tmp_path / where
    result = CliRunner().invoke(app, ["report", str(path), "--out", str(out), "--format", "md"])
    assert result.exit_code == 2, result.output
    assert f"--out {str(out)!r} {relation}" in result.output and result.output.count("\n") == 1, result.output
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (origin.parent / "spec.yaml").read_text() == spec_record


def test_report_out_beside_the_experiments_state_is_written(recorded, tmp_path):
    path, _ = recorded
    result = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "out" / "report"), "--format", "md"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "report" / "report.md").is_file()
