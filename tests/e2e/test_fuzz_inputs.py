"""Fuzzing the files a user hands over: results CSVs for `dapo-ablate report --results` and the
problem files (JSON, JSONL, parquet) of the trainer's data loader (tests/e2e/test_fuzz_strategies.py has
the strategies and the property).

A results CSV goes through the real command line (typer's CliRunner): the report is written, or the
command exits 2 with one sentence; nothing is written outside --out; and every CSV the report wrote
keeps text that a spreadsheet would run as a formula inert. A problem file goes through
`core.data.load_problems`, what the trainer calls: problems of text come back, or a DataError names
the file in one sentence.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from dapo_ablate.cli.main import app
from dapo_ablate.core.data import DataError, Problem, load_problems

from test_fuzz_strategies import (
    FUZZ,
    ODD_FLOATS,
    ODD_TEXTS,
    TEXTS,
    VALUES,
    files_under,
    hang_guard,
    inert_csv_cells,
    one_sentence_or_success,
)


# -- results CSVs -----------------------------------------------------------------------------------
KNOWN_COLUMNS = ["a", "b", "c", "overlong_filter", "clip_higher", "seed", "avg@32", "pass@32", "avg@8", "setting",
                 "tokens_generated", "tokens_discarded", "wall_s"]  # fmt: skip
CELLS = st.one_of(
    st.sampled_from([0, 1]), st.integers(-3, 3), st.floats(0, 1), ODD_FLOATS, ODD_TEXTS, TEXTS,
    st.sampled_from(["", "1.0", "0.0", " 1", "TRUE", "1e400", "-1e400", "nan", "inf", "+1", "0x1"]),
)  # fmt: skip
"""What one CSV cell may hold: the 0/1 coding and its breaks, NaN/inf, formulas, newlines, unicode."""


COLUMN_NAMES = st.sampled_from(KNOWN_COLUMNS) | TEXTS
"""Column names, line breaks and all (the CLI writes a quoted name's line break escaped: one line)."""


@st.composite
def results_table(draw: Any) -> tuple[list[Any], list[list[Any]]]:
    """A header and rows: a full factorial of 2 or 3 factors with seeds and a metric (the shape a
    report reads) with some cells and column names broken, or columns and rows at random."""
    if draw(st.booleans()):
        factors = draw(st.sampled_from([["a", "b"], ["a", "b", "c"], ["overlong_filter", "clip_higher"]]))
        seeds = draw(st.integers(1, 3))
        header: list[Any] = [*factors, "seed", "avg@32"]
        rows = [[*levels, seed, draw(st.floats(0, 1))] for levels in itertools.product([0, 1], repeat=len(factors))
                for seed in range(seeds)]  # fmt: skip
        for _ in range(draw(st.integers(0, 4))):  # breaks: a cell, a column name, a dropped row
            what = draw(st.sampled_from(["cell", "name", "drop"]))
            if what == "cell":
                row, column = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, len(header) - 1))
                rows[row][column] = draw(CELLS)
            elif what == "name":
                header[draw(st.integers(0, len(header) - 1))] = draw(COLUMN_NAMES)
            elif len(rows) > 1:
                rows.pop(draw(st.integers(0, len(rows) - 1)))
        return header, rows
    header = draw(st.lists(COLUMN_NAMES, max_size=7))
    rows = draw(st.lists(st.lists(CELLS, min_size=len(header), max_size=len(header)), max_size=10))
    return header, rows


def csv_bytes(header: list[Any], rows: list[list[Any]], quoted: bool, encoding: str) -> bytes:
    """The table as a CSV file: quoted as csv writes it (a newline inside quotes), or cells joined
    as they are (a cell's comma or newline breaks the row); in ``encoding`` (bad characters as ?)."""
    if quoted:
        buffer = io.StringIO()
        csv.writer(buffer).writerows([header, *rows])
        text = buffer.getvalue()
    else:
        text = "\n".join(",".join(map(str, row)) for row in [header, *rows]) + "\n"
    return text.encode(encoding.removesuffix("-bom"), errors="replace") if encoding != "utf-8-bom" else b"\xef\xbb\xbf" + text.encode()


REPORT_OPTIONS = st.fixed_dictionaries({
    "--format": st.sampled_from(["csv", "csv,md", "md,tex", "csv,html"]),
}, optional={
    "--metric": st.sampled_from(["avg@32", "pass@32", "avg@8", "seed", "a"]) | COLUMN_NAMES,
    "--factors": st.sampled_from(["a,b", "a,b,c", "a", "seed", "a,a", ",", "overlong_filter,clip_higher"]) | COLUMN_NAMES,
    "--design": st.sampled_from(["any", "full", "fraction-V", "fraction", "nope"]),
    "--orderings": st.sampled_from(["paper", "all", "a,b;b,a", "a;b", "x"]),
    "--confidence": st.sampled_from(["0.95", "0", "1", "nan", "-1", "2"]),
    "--adjust": st.sampled_from(["holm", "bh", "none", "bonferroni"]),
})  # fmt: skip


@FUZZ
@given(table=results_table(), quoted=st.booleans(), encoding=st.sampled_from(["utf-8", "utf-8-bom", "latin-1", "utf-16"]),
       options=REPORT_OPTIONS)  # fmt: skip
def test_a_fuzzed_results_csv_is_reported_or_refused_in_one_sentence(table, quoted, encoding, options):
    with tempfile.TemporaryDirectory(prefix="dapo-fuzz-") as folder:
        root = Path(folder)
        path, out = root / "results.csv", root / "report"
        path.write_bytes(csv_bytes(*table, quoted=quoted, encoding=encoding))
        flags = [item for option, value in options.items() if not value.startswith("-") for item in (option, value)]
        before = files_under(root, skip=out)
        with hang_guard():
            result = CliRunner().invoke(app, ["report", "--results", str(path), "--out", str(out), *flags])
        event(f"exit {result.exit_code}")  # --hypothesis-show-statistics: how many got a report
        columns = tuple(str(name) for name in table[0] if len(str(name)) > 1)
        options_named = ("confidence", "metric", "factor", "design", "ordering", "adjust", "format")
        one_sentence_or_success(result, (str(path), "results", "column", "cell", "row", *options_named, *columns))
        assert files_under(root, skip=out) == before, "the report wrote outside --out"
        if result.exit_code == 0:
            assert inert_csv_cells(out) == []


@pytest.mark.parametrize("header, metric", [(["a", "a", "a", "\r0"], "avg@32"), (["a", "b", "seed", "avg@32"], "\n")],
                         ids=["column name", "--metric"])
def test_a_column_name_with_a_line_break_is_one_sentence(header, metric):
    with tempfile.TemporaryDirectory(prefix="dapo-fuzz-") as folder:
        path = Path(folder) / "results.csv"
        rows = [[a, b, 0, 0.5] for a in (0, 1) for b in (0, 1)]
        path.write_bytes(csv_bytes(header, rows, quoted=True, encoding="utf-8"))
        result = CliRunner().invoke(app, ["report", "--results", str(path), "--out", str(Path(folder) / "r"), "--metric", metric])
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


# -- problem files ----------------------------------------------------------------------------------
PROBLEM_KEYS = st.sampled_from(["prompt", "answer", "problem", "question", "solution", "id", "data_source",
                                "reward_model", "extra_info", "ground_truth"]) | TEXTS  # fmt: skip
RECORDS = st.dictionaries(PROBLEM_KEYS, VALUES | st.sampled_from([[{"role": "user", "content": "1+1="}]]), max_size=5)
RAW_JSON = st.sampled_from([
    "NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "[" * 100_000 + "]" * 100_000, '{"a": ' * 5000 + "1" + "}" * 5000,
    '{"prompt": "\\ud800", "answer": "1"}', '{"prompt": "1+1=", "answer": "2"', "\x00", "{}", "[]", "null", '"text"',
    '{"prompt": "1+1=", "answer": "2", "prompt": 3}',
])  # fmt: skip


@st.composite
def problem_file(draw: Any) -> tuple[str, bytes]:
    """A suffix and the bytes of a problem file: JSONL lines or a JSON list of records (some of
    them raw JSON no encoder writes), or bytes at random under any suffix."""
    kind = draw(st.sampled_from(["jsonl", "json", "bytes"]))
    if kind == "bytes":
        return draw(st.sampled_from([".jsonl", ".json", ".parquet"])), draw(st.binary(max_size=200))
    records = RECORDS.map(json.dumps) | RECORDS.map(lambda record: json.dumps(record, ensure_ascii=False))
    items = draw(st.lists(records | RAW_JSON | VALUES.map(json.dumps), max_size=6))
    if kind == "jsonl":
        return ".jsonl", "\n".join(items).encode("utf-8", errors="surrogatepass")
    return ".json", ("[" + ", ".join(items) + "]").encode("utf-8", errors="surrogatepass")


@FUZZ
@given(file=problem_file(), keys=st.none() | st.tuples(PROBLEM_KEYS, PROBLEM_KEYS), limit=st.none() | st.integers(-1, 3))
def test_a_fuzzed_problem_file_loads_as_text_problems_or_is_refused_in_one_sentence(file, keys, limit):
    suffix, data = file
    with tempfile.TemporaryDirectory(prefix="dapo-fuzz-") as folder:
        path = Path(folder) / f"train{suffix}"
        path.write_bytes(data)
        prompt_key, answer_key = keys or (None, None)
        with hang_guard():
            try:
                problems = load_problems(path, limit=limit, prompt_key=prompt_key, answer_key=answer_key)
            except DataError as err:
                message = str(err)
                assert message.startswith(f"{path}: ") and "\n" not in message, message
                return
        assert problems and all(isinstance(problem, Problem) for problem in problems)
        for problem in problems:
            assert isinstance(problem.answer, str)
            assert isinstance(problem.prompt, str) or all(isinstance(m, dict) for m in problem.prompt)
        assert files_under(Path(folder)) == {path.name: len(data)}


def test_the_table_strategy_writes_what_a_report_reads():
    """The unbroken table is a valid results CSV: the fuzzer starts from inputs that get far."""
    header = ["a", "b", "seed", "avg@32"]
    rows = [[a, b, seed, 0.3 + 0.1 * a + 0.01 * seed] for a in (0, 1) for b in (0, 1) for seed in range(2)]
    with tempfile.TemporaryDirectory(prefix="dapo-fuzz-") as folder:
        path = Path(folder) / "results.csv"
        path.write_bytes(csv_bytes(header, rows, quoted=True, encoding="utf-8"))
        result = CliRunner().invoke(app, ["report", "--results", str(path), "--out", str(Path(folder) / "r"), "--format", "csv"])
        assert result.exit_code == 0, result.output
        assert (Path(folder) / "r" / "effects.csv").is_file()
