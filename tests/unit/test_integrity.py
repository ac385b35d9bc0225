"""Stores: nothing forged is trusted and nothing outside is touched. A ledger opens only
an empty database or its own; a finished run's result must be a mapping of numbers, and one
already stored that is not never counts as done; an experiment name is bound to its design; a
sweep resumed with another search space is refused; the key that seals kept results is created
once per experiment. Ledger contract tests run on SQLite, PostgreSQL and memory (test_ledger's
fixtures)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.binding import experiment_digest
from dapo_ablate.ablation.store.ledger import Ledger, LedgerError, SQLLedger, check_ledger, connect_ledger
from dapo_ablate.ablation.store.results import ResultsError, load_experiment_results, status_rows

from test_ledger import RESULT, another_handle, backend_url, ledger, make_runs  # noqa: F401 - fixtures


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_sentence(err: BaseException) -> str:
    message = str(err)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_another_applications_sqlite_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
        db.execute("INSERT INTO users (email) VALUES ('a@example.org')")
    before = file_digest(path)
    with pytest.raises(LedgerError) as raised:
        SQLLedger(f"sqlite:///{path}")
    message = one_sentence(raised.value)
    assert "not a dapo-ablate ledger" in message and "users" in message and "ledger:" in message
    assert file_digest(path) == before
    with sqlite3.connect(path) as db:
        assert [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["users"]
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # not switched to WAL


@pytest.mark.postgres
def test_another_applications_postgresql_database_is_refused_and_left_untouched(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE invoices (id INTEGER PRIMARY KEY)"))
    with pytest.raises(LedgerError, match="not a dapo-ablate ledger") as raised:
        SQLLedger(postgres_url)
    one_sentence(raised.value)
    with engine.connect() as connection:
        tables = connection.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars()
        assert sorted(tables) == ["invoices"]
    engine.dispose()


def test_check_ledger_reads_only_and_refuses_what_opening_would(tmp_path: Path) -> None:
    foreign, garbage, ours = tmp_path / "app.db", tmp_path / "garbage.db", tmp_path / "ours.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
    garbage.write_bytes(b"not a database at all" * 100)
    SQLLedger(f"sqlite:///{ours}").close()
    os.mkfifo(tmp_path / "fifo.db")
    (tmp_path / "loop.db").symlink_to(tmp_path / "loop.db")
    before = {path: file_digest(path) for path in (foreign, garbage)}
    refused = ((foreign, "not a dapo-ablate ledger"), (garbage, "not a database"), (tmp_path / "fifo.db", "is not a regular file"),
               (tmp_path, "is a directory"), (tmp_path / "loop.db", "is a link loop; check `ledger:`"))
    for path, words in refused:
        with pytest.raises(LedgerError, match=words) as raised:
            check_ledger(f"sqlite:///{path}")
        one_sentence(raised.value)
    check_ledger(f"sqlite:///{ours}")
    check_ledger(f"sqlite:///{tmp_path / 'new' / 'ledger.db'}")
    assert not (tmp_path / "new").exists()
    assert {path: file_digest(path) for path in before} == before
    with pytest.raises(LedgerError, match="not a database URL"):
        check_ledger("::nonsense")


def test_a_garbage_ledger_file_is_one_sentence_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(bytes(range(256)) * 40)
    before = file_digest(path)
    with pytest.raises(LedgerError) as raised:
        SQLLedger(f"sqlite:///{path}")
    assert "not a database" in one_sentence(raised.value)
    assert file_digest(path) == before


def test_an_empty_file_or_database_becomes_a_ledger_and_its_own_ledger_reopens(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.touch()
    with SQLLedger(f"sqlite:///{path}") as opened:
        opened.ensure_experiment("exp", {})
    with SQLLedger(f"sqlite:///{path}") as reopened:
        assert reopened.get_experiment("exp") is not None


def test_validate_and_status_read_a_foreign_database_without_writing_to_it(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path)
    spec = load_spec(spec_path)
    path = Path(spec.ledger.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    before = file_digest(path)
    with pytest.raises(LedgerError, match="not a dapo-ablate ledger"):
        status_rows(spec, expand(spec))
    assert file_digest(path) == before


BAD_METRICS = [{}, [], "0.5", None, 0.5, {"avg@32": "high"}, {"avg@32": [0.5]}, {"avg@32": {"x": 1}},
               {"avg@32": True}, {"": 0.5}]


@pytest.mark.parametrize("metrics", BAD_METRICS, ids=repr)
def test_finish_refuses_metrics_that_are_not_a_non_empty_mapping_of_numbers(ledger: Ledger, metrics) -> None:
    run_id = make_runs([0])[0].run_id
    ledger.add_runs("exp", make_runs([0]))
    assert ledger.claim(run_id, "h:1")
    with pytest.raises(ValueError, match="metrics"):
        ledger.finish(run_id, {**RESULT, "metrics": metrics})
    assert ledger.runs_table("exp")[0]["status"] == "running" and ledger.results("exp") == []
    assert ledger.finish(run_id, RESULT)


@pytest.mark.parametrize("bad", [{"eval_curve": [1, 2]}, {"signals": "steps"}, {"eval_curve": {"step": 1}}], ids=repr)
def test_finish_refuses_curves_that_are_not_lists_of_mappings(ledger: Ledger, bad) -> None:
    run_id = make_runs([0])[0].run_id
    ledger.add_runs("exp", make_runs([0]))
    assert ledger.claim(run_id, "h:1")
    with pytest.raises(ValueError, match="eval_curve|signals"):
        ledger.finish(run_id, {**RESULT, **bad})
    assert ledger.results("exp") == []


def write_spec(tmp_path: Path, **fields) -> Path:
    out = tmp_path / "out"
    data = {"name": "exp", "trainer": {}, "factors": ["overlong_filter", "clip_higher"], "seeds": 1,
            "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db",
            "tracking": {"uri": f"sqlite:///{out}/mlflow.db"}}
    data.update(fields)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("stored", ["[]", '"0.5"', "{}", '{"avg@32": "high"}', "null"])
def test_a_malformed_result_already_stored_is_not_done_and_is_trained_again(tmp_path: Path, stored: str) -> None:
    """What an older dapo-ablate let in: status and report read it without a traceback, as a run
    that is not done; the next `run` reopens it (`reopen_malformed`)."""
    spec = load_spec(write_spec(tmp_path))
    plan = expand(spec)
    good, bad = plan.runs[0].run_id, plan.runs[1].run_id
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        for run_id in (good, bad):
            assert ledger.claim(run_id, "h:1") and ledger.finish(run_id, RESULT)
    engine = create_engine(spec.ledger)
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE results SET metrics = '{stored}' WHERE run_id = :id"), {"id": bad})
    engine.dispose()

    rows, counts = status_rows(spec, plan)
    by_id = {row["run_id"]: row for row in rows}
    assert by_id[good]["status"] == "done" and by_id[bad]["status"] == "failed"
    assert "stored result" in by_id[bad]["error"] and "dapo-ablate run" in by_id[bad]["error"]
    assert by_id[bad]["metric"] is None and counts["done"] == 1
    results, *_ = load_experiment_results(spec)
    assert list(results["run_id"]) == [good]

    with SQLLedger(spec.ledger) as ledger:
        assert ledger.reopen_malformed(spec.name) == [bad]
        assert ledger.reopen_malformed(spec.name) == []
        assert bad in ledger.claimable(spec.name)
        assert [row["run_id"] for row in ledger.results(spec.name)] == [good]


def test_a_report_of_only_malformed_results_is_a_sentence(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    plan = expand(spec)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        run_id = plan.runs[0].run_id
        assert ledger.claim(run_id, "h:1") and ledger.finish(run_id, RESULT)
    engine = create_engine(spec.ledger)
    with engine.begin() as connection:
        connection.execute(text("UPDATE results SET metrics = '[]'"))
    engine.dispose()
    with pytest.raises(ResultsError, match="no finished runs"):
        load_experiment_results(spec)


def test_the_result_key_is_created_once_per_experiment(ledger: Ledger, another_handle) -> None:
    key = ledger.result_key("exp")
    assert isinstance(key, bytes) and len(key) == 32
    assert another_handle().result_key("exp") == key
    ledger.ensure_experiment("other", {})
    assert ledger.result_key("other") != key
    with pytest.raises(LedgerError, match="no experiment named 'absent'"):
        ledger.result_key("absent")


def test_an_experiment_name_is_bound_to_the_first_digest_it_is_given(ledger: Ledger) -> None:
    ledger.ensure_experiment("bound", {"seeds": [0]}, digest="d1")
    assert ledger.get_experiment("bound").digest == "d1"
    ledger.ensure_experiment("bound", {"seeds": [0, 1]}, digest="d1")  # e.g. seeds added
    assert ledger.get_experiment("bound").spec == {"seeds": [0, 1]}
    with pytest.raises(LedgerError, match="another name") as raised:
        ledger.ensure_experiment("bound", {"factors": ["x"]}, digest="d2")
    one_sentence(raised.value)
    assert ledger.get_experiment("bound").spec == {"seeds": [0, 1]}  # nothing written
    ledger.ensure_experiment("exp", {"design": "full"}, digest="d3")  # created without one: adopts it
    assert ledger.get_experiment("exp").digest == "d3"
    ledger.ensure_experiment("exp", {"design": "full"})  # no digest given (a sweep): not checked
    assert ledger.get_experiment("exp").digest == "d3"


def test_the_digest_covers_the_design_and_base_config_but_not_seeds_or_stores(tmp_path: Path) -> None:
    base = experiment_digest(load_spec(write_spec(tmp_path)))
    same = [{"seeds": [0, 1, 2]}, {"executor": {"max_concurrent": 1}}, {"tracking": {"uri": "sqlite:///x.db"}},
            {"output_dir": str(tmp_path / "elsewhere")}, {"ledger": "sqlite:///y.db"}]
    for fields in same:
        assert experiment_digest(load_spec(write_spec(tmp_path, **fields))) == base, fields
    other = [{"factors": ["soft_overlong", "clip_higher"]}, {"factors": ["overlong_filter", {"eps_high": [0.2, 0.3]}]},
             {"trainer": {"algorithm": {"eps_high": 0.3}}}, {"design": "one_at_a_time"},
             {"settings": [{"name": "a"}, {"name": "b", "overrides": {"optim.lr": 1e-5}}]}]
    for fields in other:
        assert experiment_digest(load_spec(write_spec(tmp_path, **fields))) != base, fields


def test_status_of_another_design_under_a_bound_name_is_refused_with_how_to_name_it(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    with SQLLedger(spec.ledger) as opened:
        opened.ensure_experiment(spec.name, spec.to_dict(), digest=experiment_digest(spec))
    other = load_spec(write_spec(tmp_path, factors=["soft_overlong", "clip_higher"]))
    with pytest.raises(LedgerError, match="name") as raised:
        status_rows(other, expand(other))
    message = one_sentence(raised.value)
    assert "'exp'" in message and "factors" in message
    more_seeds = load_spec(write_spec(tmp_path, seeds=3))
    rows, _ = status_rows(more_seeds, expand(more_seeds))
    assert len(rows) == 12


def test_connect_ledger_of_memory_has_the_new_methods() -> None:
    memory = connect_ledger("memory://")
    memory.ensure_experiment("exp", {}, digest="d")
    assert memory.reopen_malformed("exp") == [] and len(memory.result_key("exp")) == 32


def write_sweep(tmp_path: Path, **fields) -> Path:
    out = tmp_path / "out"
    data = {"name": "sw", "trainer": {}, "space": {"eps_high": {"low": 0.2, "high": 0.5}}, "n_trials": 2,
            "sampler": {"type": "random", "seed": 3}, "pruner": "none", "output_dir": str(out),
            "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"}}
    data.update(fields)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def open_sweep(path: Path):
    from dapo_ablate.sweeps.runner import SweepRun
    from dapo_ablate.sweeps.spec import load_sweep

    scheduler = SweepRun(load_sweep(path), None, progress=False, n_trials=None, local=True)
    scheduler.open_study()
    scheduler.ledger.close()
    scheduler.storage.engine.dispose()
    return scheduler


@pytest.mark.parametrize("space, words", [
    ({"eps_high": {"low": 0.2, "high": 0.6}}, ["eps_high", "high", "0.5", "0.6"]),
    ({"eps_high": {"low": 0.2, "high": 0.5}, "lr": {"low": 1e-6, "high": 1e-5, "log": True}}, ["lr", "added"]),
    ({"lr": {"low": 1e-6, "high": 1e-5, "log": True}}, ["eps_high", "removed"]),
])
def test_a_sweep_resumed_with_another_space_is_refused_naming_the_difference(tmp_path: Path, space, words) -> None:
    from dapo_ablate.sweeps.study import StudyError, load_study
    from dapo_ablate.sweeps.spec import load_sweep

    open_sweep(write_sweep(tmp_path))
    open_sweep(write_sweep(tmp_path, n_trials=4))  # a bigger budget resumes
    changed = write_sweep(tmp_path, space=space)
    with pytest.raises(StudyError) as raised:
        open_sweep(changed)
    message = one_sentence(raised.value)
    assert all(word in message for word in words), message
    assert "new name" in message
    stored = load_study(load_sweep(changed)).user_attrs["dapo.space"]
    assert set(stored) == {"eps_high"} and stored["eps_high"]["high"] == 0.5  # nothing overwritten
    with SQLLedger(load_sweep(changed).ledger) as opened:
        assert opened.get_experiment("sw").spec["space"]["eps_high"]["high"] == 0.5
