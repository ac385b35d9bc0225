"""Fuzzing what the product reads back: hand-edited ledger rows.

A finished experiment (2 factors x 2 seeds, every run done, each cell's avg@32 in its own band:
0.30 + 0.10 OF + 0.05 CH + 0.01 seed) has one value of its ledger replaced by a hostile one: a
factor level swapped or made up, a status nobody writes, a negative attempt count, a metric out of
range or not a number, a curve that is not a list, a row deleted. Then `status` and `report`
(through typer's CliRunner, as the command line calls them). The property: success or exit 2 with
one sentence, never a traceback or another exception; and a report that succeeds puts each
cell's mean inside that cell's own band (never another cell's runs under its label, never an
invalid value counted)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import event, given, reject, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.binding import experiment_digest
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.cli.main import app

from support import write_spec
from test_fuzz_strategies import EXAMPLES, FUZZ, hang_guard, one_sentence_or_success

LEDGER_FUZZ = settings(FUZZ, max_examples=min(EXAMPLES, 30))
"""Each example runs `status` and a tables-only `report` (about a second): fewer than the spec fuzzers."""


def band(factors: dict[str, int]) -> float:
    return 0.30 + 0.10 * factors["overlong_filter"] + 0.05 * factors["clip_higher"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """The folder of a finished experiment whose ledger the examples copy."""
    root = tmp_path_factory.mktemp("finished")
    spec = load_spec(write_spec(root, seeds=2))
    plan = expand(spec)
    Path(spec.output_dir).mkdir(parents=True)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict(), digest=experiment_digest(spec))
        ledger.add_runs(spec.name, plan.run_specs())
        for run in plan.runs:
            assert ledger.claim(run.run_id, "h")
            accuracy = band(run.factors) + 0.01 * run.seed
            ledger.finish(run.run_id, {"metrics": {"avg@32": accuracy}, "eval_curve": [{"step": 0, "avg@32": 0.3},
                                       {"step": 2, "avg@32": accuracy}], "signals": [], "tokens_generated": 10,
                                       "tokens_discarded": 0, "wall_s": 1.0})
    return root


NOT_A_NUMBER = st.sampled_from([None, "", "x", [], {}, "NaN", True])
EDITS: dict[tuple[str, str], st.SearchStrategy] = {
    ("runs", "factors"): st.one_of(
        st.sampled_from([{"overlong_filter": 1, "clip_higher": 1}, {"overlong_filter": 0, "clip_higher": 0},
                         {"overlong_filter": 2, "clip_higher": 0}, {"overlong_filter": 0}, {"x": 1}, {}, [], "on", None]),
        st.dictionaries(st.sampled_from(["overlong_filter", "clip_higher", "dynamic_sampling"]),
                        st.one_of(st.integers(-2, 3), NOT_A_NUMBER), max_size=3)),
    ("runs", "status"): st.sampled_from(["done", "failed", "running", "pending", "finished", "", None, "DONE"]),
    ("runs", "seed"): st.one_of(st.integers(-(2**40), 2**40), NOT_A_NUMBER),
    ("runs", "attempts"): st.one_of(st.integers(-(2**40), 2**40), NOT_A_NUMBER),
    ("runs", "cell_key"): st.sampled_from(["", "zz", "0", "00", "11", None]),
    ("results", "metrics"): st.one_of(
        st.fixed_dictionaries({"avg@32": st.one_of(st.floats(1.0001, 1e300), st.floats(-1e300, -0.0001), NOT_A_NUMBER)}),
        st.sampled_from([{}, [], "x", None, {"pass@32": 0.5}])),
    ("results", "eval_curve"): st.sampled_from(["x", [1, 2], [{"step": "a", "avg@32": 0.3}], [{"avg@32": 9}], None, {}]),
    ("results", "wall_s"): st.one_of(st.floats(allow_nan=True, allow_infinity=True), NOT_A_NUMBER),
    ("results", "tokens_generated"): st.one_of(st.integers(-(2**62), 2**62), NOT_A_NUMBER),
}
DELETES = st.sampled_from(["results", "runs", "experiment_runs"])
JSON_COLUMNS = {"factors", "metrics", "eval_curve"}


def edit(ledger_db: Path, run_index: int, change: tuple[str, str, Any] | str) -> None:
    """One hand edit of the SQLite ledger: (table, column, value) on one run's row, or a deleted row."""
    engine = create_engine(f"sqlite:///{ledger_db}")
    with engine.begin() as connection:
        run_ids = [row[0] for row in connection.execute(text("SELECT run_id FROM runs ORDER BY run_id"))]
        run_id = run_ids[run_index % len(run_ids)]
        if isinstance(change, str):
            connection.execute(text(f"DELETE FROM {change} WHERE run_id = :r"), {"r": run_id})
        else:
            table, column, value = change
            stored = json.dumps(value) if column in JSON_COLUMNS and value is not None else value
            if isinstance(stored, (list, dict)):
                stored = json.dumps(stored)
            connection.execute(text(f"UPDATE {table} SET {column} = :v WHERE run_id = :r"), {"v": stored, "r": run_id})
    engine.dispose()


CHANGES = st.one_of(DELETES, st.sampled_from(sorted(EDITS)).flatmap(
    lambda place: EDITS[place].map(lambda value: (*place, value))))


@LEDGER_FUZZ
@given(run_index=st.integers(0, 7), change=CHANGES)
def test_a_hand_edited_ledger_row_is_reported_within_its_cell_or_refused_in_one_sentence(finished, tmp_path_factory,
                                                                                          run_index, change):
    root = tmp_path_factory.mktemp("edited")
    shutil.copytree(finished, root, dirs_exist_ok=True)
    spec_path = write_spec(root, seeds=2)  # the same spec, its stores in this copy
    try:
        edit(root / "out" / "ledger.db", run_index, change)
    except IntegrityError:  # the ledger's own constraints refuse this edit (a NULL where none may be): no such ledger
        reject()
    event(str(change if isinstance(change, str) else change[:2]))
    with hang_guard():
        status = CliRunner().invoke(app, ["status", str(spec_path)])
        report = CliRunner().invoke(app, ["report", str(spec_path), "--out", str(root / "report"), "--format", "csv"])
    names = ("ledger", "run", "cell", "seed", "column", str(spec_path))  # a sentence names the row or the store
    one_sentence_or_success(status, names)
    one_sentence_or_success(report, names)
    event(f"status {status.exit_code}, report {report.exit_code}")
    if report.exit_code == 0:
        cells = pd.read_csv(root / "report" / "cells.csv")
        for _, cell in cells.iterrows():
            low = band({"overlong_filter": int(cell["overlong_filter"]), "clip_higher": int(cell["clip_higher"])})
            scale = 100 if cell["mean"] > 1.5 else 1  # pp or fractions, as the report chose
            assert low * scale - 1e-9 <= cell["mean"] <= (low + 0.01) * scale + 1e-9, (change, cells.to_dict("records"))
