"""Hostile state: files and rows someone else put where the product keeps its own state. Only state
the product wrote (and sealed) for a run is trusted; anything else is ignored with a note and
computed again, or refused in one sentence naming the row or file and the fix.

The runs here are the real trainer on the built-in policy (a few seconds each), called as a Ray
task calls it (`run_cell`, with the experiment's worker key in its environment, as the driver's
pool sets it); the tests that start Ray and `dapo-ablate run` are in tests/e2e."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.executor import record_spec
from dapo_ablate.ablation.runtime.jobs import SEAL_ENV
from dapo_ablate.ablation.runtime.pool import worker_key
from dapo_ablate.ablation.runtime.task import execute_run
from dapo_ablate.ablation.store.kept_results import ResultKeeper
from dapo_ablate.cli.main import app
from dapo_ablate.core.config import TrainerConfig
from dapo_ablate.core.evaluation import cached_initial_eval

from support import counting_cell, write_spec
from tiny_configs import TINY_TRAINER

CHECKPOINTED = {**TINY_TRAINER, "schedule": {"total_steps": 4, "eval_every": 2, "checkpoint_every": 2}}


def config_of(seed: int) -> dict:
    return TrainerConfig(**copy.deepcopy({**CHECKPOINTED, "schedule": {**CHECKPOINTED["schedule"], "seed": seed}})).to_dict()


@pytest.fixture
def keyed(monkeypatch) -> bytes:
    """The task environment the driver gives a run: the experiment's worker key."""
    key = worker_key(b"k" * 32)
    monkeypatch.setenv(SEAL_ENV, key.hex())
    return key


@pytest.mark.parametrize("entry", ["plain metrics", "another key's", "a link"])
def test_an_evaluation_cache_entry_not_sealed_under_this_key_is_computed_again(tmp_path, entry):
    key, notes = "k" * 24, []
    path = tmp_path / f"initial-eval-{key}.json"
    if entry == "plain metrics":
        path.write_text(json.dumps({"step": 0, "avg@4": 0.99}))
    elif entry == "another key's":
        cached_initial_eval(tmp_path, key, lambda: {"step": 0, "avg@4": 0.99}, b"another experiment's key")
    else:
        (tmp_path / "outside.json").write_text(json.dumps({"step": 0, "avg@4": 0.99}))
        path.symlink_to(tmp_path / "outside.json")
    metrics = cached_initial_eval(tmp_path, key, lambda: {"step": 0, "avg@4": 0.25}, b"this experiment's key", notes.append)
    assert metrics == {"step": 0, "avg@4": 0.25} and len(notes) == 1 and str(path) in notes[0]
    assert cached_initial_eval(tmp_path, key, lambda: {"step": 0, "avg@4": 0.5}, b"this experiment's key", notes.append) == metrics
    assert len(notes) == 1 and not path.is_symlink()


# -- links planted where a run writes -------------------------------------------------------------------
@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside the output folder that a planted link points to."""
    (tmp_path / "outside").mkdir()
    path = tmp_path / "outside" / "victim"
    path.write_text("precious\n")
    return path


def test_a_link_planted_as_a_run_folder_is_replaced_and_nothing_is_written_where_it_points(tmp_path, victim):
    """The task body (what every Ray task runs) replaces the link by a folder of its own before the
    run writes into it; the folder it pointed to is left alone."""
    run_dir = tmp_path / "out" / "exp" / "run-a"
    run_dir.parent.mkdir(parents=True)
    run_dir.symlink_to(victim.parent)
    result = execute_run(counting_cell, {"techniques": {"clip_higher": False}, "schedule": {"seed": 0}}, str(run_dir),
                         str(tmp_path / "out" / "eval-cache"))
    assert result["metrics"]["avg@32"] == 0.25
    assert not run_dir.is_symlink() and (run_dir / "calls").is_file()
    assert sorted(path.name for path in victim.parent.iterdir()) == ["victim"] and victim.read_text() == "precious\n"


def test_a_kept_result_is_never_written_through_a_link_planted_as_its_run_folder(tmp_path, victim):
    keeper = ResultKeeper(tmp_path / "out" / "exp", b"k" * 32)
    keeper.run_root.mkdir(parents=True)
    (keeper.run_root / "run-a").symlink_to(victim.parent)
    assert keeper.keep("run-a", {"metrics": {"avg@32": 0.5}})
    assert keeper.load("run-a")["metrics"] == {"avg@32": 0.5} and not (keeper.run_root / "run-a").is_symlink()
    assert sorted(path.name for path in victim.parent.iterdir()) == ["victim"]


@pytest.mark.parametrize("planted", ["the entry's temporary file", "the entry's lock file", "the cache folder"])
def test_an_evaluation_cache_write_never_goes_through_a_planted_link(tmp_path, victim, planted):
    key, cache = "k" * 24, tmp_path / "out" / "eval-cache"
    cache.parent.mkdir()
    if planted == "the cache folder":
        cache.symlink_to(victim.parent)
    else:
        cache.mkdir()
        name = f"initial-eval-{key}.tmp" if planted == "the entry's temporary file" else f"initial-eval-{key}.lock"
        (cache / name).symlink_to(victim)
    dangling = tmp_path / "outside" / "never-created"
    if planted == "the entry's lock file":
        (cache / name).unlink()
        (cache / name).symlink_to(dangling)  # opening a dangling link to append would create its target
    assert cached_initial_eval(cache, key, lambda: {"step": 0, "avg@4": 0.25}, b"key") == {"step": 0, "avg@4": 0.25}
    assert sorted(path.name for path in victim.parent.iterdir()) == ["victim"] and victim.read_text() == "precious\n"
    assert cached_initial_eval(cache, key, lambda: {"step": 0, "avg@4": 0.5}, b"key") == {"step": 0, "avg@4": 0.25}


# -- two names, one folder ---------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "validate", "status"])
def test_two_experiment_names_that_share_a_folder_are_refused_naming_both(tmp_path, command):
    """``h3 x`` and ``h3/x`` both keep their runs in ``out/h3_x``: once ``h3 x`` recorded its spec
    there, ``h3/x`` is refused in one sentence naming both and how to rename, before anything is written."""
    record_spec(load_spec(write_spec(tmp_path / "first", name="h3 x", output_dir=str(tmp_path / "out"))))
    second = write_spec(tmp_path / "second", name="h3/x", output_dir=str(tmp_path / "out"))
    before = sorted(path.name for path in (tmp_path / "out").rglob("*"))
    result = CliRunner().invoke(app, [command, str(second)])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert message.count("\n") == 0 and "'h3/x'" in message and "'h3 x'" in message, message
    assert str(tmp_path / "out" / "h3_x") in message and "another name" in message, message
    assert sorted(path.name for path in (tmp_path / "out").rglob("*")) == before


# -- hand-edited ledger rows ------------------------------------------------------------------------------
def test_hand_edited_ledger_rows_are_never_counted_and_go_back_to_training(ledger_url):
    """A `done` row whose result row was deleted (every `run` crashed on it) and a result whose
    avg@32 was edited to 7.5 (accepted) are unusable results: reads show the run failed with why,
    the driver's start (`reopen_malformed`) gives both back to pending; `finish` refuses 7.5."""
    from sqlalchemy import create_engine, text

    from dapo_ablate.ablation.experiment.identity import RunSpec
    from dapo_ablate.ablation.store.ledger import SQLLedger

    runs = [RunSpec(f"run-{key}", key, {"clip_higher": int(key)}, 0, {"lr": 1e-6}) for key in ("0", "1")]
    result = {"metrics": {"avg@32": 0.5}, "eval_curve": [], "signals": []}
    with SQLLedger(ledger_url) as ledger:
        ledger.ensure_experiment("exp", {"name": "exp"})
        ledger.add_runs("exp", runs)
        for run in runs:
            assert ledger.claim(run.run_id, "host") and ledger.finish(run.run_id, result)
        with pytest.raises(ValueError, match="avg@32 is an accuracy, a fraction in"):
            ledger.finish("run-1", {**result, "metrics": {"avg@32": 7.5}})
    engine = create_engine(ledger_url)
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM results WHERE run_id = 'run-0'"))
        connection.execute(text("""UPDATE results SET metrics = '{"avg@32": 7.5}' WHERE run_id = 'run-1'"""))
    engine.dispose()
    with SQLLedger(ledger_url) as ledger:
        table = {row["run_id"]: row for row in ledger.runs_table("exp")}
        assert table["run-0"]["status"] == "failed" and "marked done but has no stored result" in table["run-0"]["error"]
        assert table["run-1"]["status"] == "failed" and "avg@32 is an accuracy" in table["run-1"]["error"]
        assert ledger.results("exp") == []
        assert ledger.reopen_malformed("exp") == ["run-0", "run-1"]
        assert {row["status"] for row in ledger.runs_table("exp")} == {"pending"}


def test_swapped_factor_levels_in_the_ledger_are_refused_not_reported_under_other_labels(tmp_path):
    """Two rows' factor levels swapped by hand: `report` put each cell's mean under the other's
    label while `status` kept them right. Now the row is checked against the cell its run id was
    made from, and `report` is one sentence naming the row, exit 2."""
    from sqlalchemy import create_engine, text

    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.store.ledger import SQLLedger
    from dapo_ablate.ablation.store.results import ResultsError, load_experiment_results

    spec = load_spec(write_spec(tmp_path, seeds=1))
    plan = expand(spec)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        for i, run in enumerate(plan.runs):
            assert ledger.claim(run.run_id, "host")
            ledger.finish(run.run_id, {"metrics": {"avg@32": 0.4 + 0.05 * i}, "eval_curve": [], "signals": []})
    results, *_ = load_experiment_results(spec)  # as written: read
    assert len(results) == len(plan.runs)
    first, second = plan.runs[0], plan.runs[-1]
    engine = create_engine(spec.ledger)
    with engine.begin() as connection:
        for mine, theirs in ((first, second), (second, first)):
            connection.execute(text("UPDATE runs SET factors = :f WHERE run_id = :r"),
                               {"f": json.dumps(theirs.factors), "r": mine.run_id})
    engine.dispose()
    with pytest.raises(ResultsError, match=f"records run {first.run_id} as cell .* but that run id is cell"):
        load_experiment_results(spec)
    done = CliRunner().invoke(app, ["report", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "report")])
    assert done.exit_code == 2 and "the row was edited" in done.output, done.output
    assert not (tmp_path / "report").exists()
