"""Hostile results files: ``load_results_csv`` refuses in one sentence, before reading
anything it cannot bound, a FIFO (which would block forever), a device (/dev/zero never ends), a
directory, a file over MAX_RESULTS_BYTES and a line over MAX_LINE_BYTES.

Each refusal runs in a subprocess with a generous timeout: the test fails, instead of hanging the
suite, if the loader blocks or reads without end.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_hostile_reports_input_e2e.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dapo_ablate.reports import ReportInputError, load_results_csv


def _write(tmp_path: Path, table) -> Path:
    path = tmp_path / "results.csv"
    table.to_csv(path, index=False)
    return path


def _results(factors=("a", "b", "c"), seeds=2):
    from dapo_ablate.reports.simulate import simulate_results

    return simulate_results(list(factors), 0.3, {("a",): 0.05}, seeds, 0.01)


def test_a_directory_gets_its_own_sentence(tmp_path):
    with pytest.raises(ReportInputError, match="is a directory; pass the results CSV file"):
        load_results_csv(tmp_path)


def test_a_line_over_the_limit_is_refused_by_its_number(tmp_path):
    long_line = tmp_path / "results.csv"
    long_line.write_bytes(b"a,seed,avg@32\n0,0,0.5\n1,0," + b"9" * (2**20 + 10) + b"\n")
    with pytest.raises(ReportInputError, match=r"line 3 is longer than 1 MiB"):
        load_results_csv(long_line)


def test_a_missing_file_and_an_unreadable_one_are_named(tmp_path):
    with pytest.raises(ReportInputError, match="does not exist; check the --results path"):
        load_results_csv(tmp_path / "nope.csv")
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.csv"
        locked.write_text("a,seed,avg@32\n")
        locked.chmod(0)
        with pytest.raises(ReportInputError, match=r"cannot be read \(Permission denied\); check its permissions$"):
            load_results_csv(locked)


def test_a_non_numeric_compute_column_is_named(tmp_path):
    table = _results().astype({"tokens_generated": object})
    table.loc[3, "tokens_generated"] = "abc"
    with pytest.raises(ReportInputError, match=r"compute column 'tokens_generated' is not a number \('abc'\) in cell "
                       r".*seed 1.*; fix it or leave it empty"):  # fmt: skip
        load_results_csv(_write(tmp_path, table))


def test_only_the_baseline_and_full_cells_is_refused_as_confounded(tmp_path):
    table = _results()
    table = table[(table[["a", "b", "c"]].sum(axis=1) % 3) == 0]  # baseline and a+b+c only
    with pytest.raises(ReportInputError, match=r"factor columns 'a', 'b' and 'c' are equal in every row.*cannot be "
                       r"told apart; run cells that switch them separately"):  # fmt: skip
        load_results_csv(_write(tmp_path, table))


def test_opposite_factor_columns_are_refused_as_confounded(tmp_path):
    table = _results()
    table = table[table["a"] != table["b"]]
    with pytest.raises(ReportInputError, match=r"factor columns 'a' and 'b' are opposite in every row"):
        load_results_csv(_write(tmp_path, table))


def test_a_metric_too_large_for_the_arithmetic_is_refused(tmp_path):
    table = _results()
    table.loc[2, "avg@32"] = 1e308
    with pytest.raises(ReportInputError, match=r"metric column 'avg@32' is 1e\+308 in cell .*seed 0; .*beyond"):
        load_results_csv(_write(tmp_path, table))


@pytest.mark.parametrize(
    ("coding", "holds"),
    [({0: "no", 1: "yes"}, "'no' and 'yes'"), ({0: None, 1: 1}, "1 and blanks"), ({0: "off", 1: None}, "'off' and blanks")],
)
def test_an_inferred_factor_with_another_coding_is_named(tmp_path, coding, holds):
    table = _results()
    table["a"] = table["a"].map(coding)
    with pytest.raises(ReportInputError) as raised:
        load_results_csv(_write(tmp_path, table))
    message = str(raised.value)
    assert f"column 'a' tells them apart but is not coded 0/1 (it holds {holds})" in message, message
    assert "code 'a' 0/1 (or -1/+1) in every row" in message


@pytest.mark.parametrize(("coding", "said"), [({0: "no", 1: "yes"}, "has level 'no'"), ({0: None, 1: 1}, "is empty")])
def test_a_named_factor_with_another_coding_is_named(tmp_path, coding, said):
    table = _results()
    table["a"] = table["a"].map(coding)
    with pytest.raises(ReportInputError) as raised:
        load_results_csv(_write(tmp_path, table), ["a", "b", "c"])
    message = str(raised.value)
    assert f"factor column 'a' {said} (data row 1, seed 0); code each factor 0/1 (or -1/+1) in every row" in message
    assert "(or 0/1 everywhere)" not in message


def test_a_results_path_and_its_cells_are_echoed_on_one_line(tmp_path):
    """The file named whole and escaped, why it is no file worded as core/config_errors words it,
    and a cell's value as the table writes it (a number plain, text quoted and cut at 60)."""
    with pytest.raises(ReportInputError) as raised:
        load_results_csv(tmp_path / "no\nsuch.csv")
    assert str(raised.value) == f"results file {str(tmp_path / 'no') + chr(10) + 'such.csv'!r} does not exist; check the --results path"
    os.symlink("loop.csv", tmp_path / "loop.csv")
    with pytest.raises(ReportInputError, match=r"loop.csv' is a link loop; check the --results path$"):
        load_results_csv(tmp_path / "loop.csv")
    table = _results()
    table["tokens_generated"] = -1.5
    with pytest.raises(ReportInputError, match=r"compute column 'tokens_generated' is negative \(-1.5\) in cell "):
        load_results_csv(_write(tmp_path, table))
    table["tokens_generated"] = "x" * 200
    with pytest.raises(ReportInputError) as raised:
        load_results_csv(_write(tmp_path, table))
    assert f"is not a number ('{'x' * 56}...) in cell" in str(raised.value)


def test_one_accuracy_out_of_range_is_refused_naming_its_row_not_a_switch_of_units(tmp_path: Path):
    """A column of fractions with one 1.05 (a typo, or a percentage pasted in) would have switched
    every page from percentage points to raw numbers without a word."""
    table = _results()
    table.loc[3, "avg@32"] = 1.05
    with pytest.raises(ReportInputError) as refused:
        load_results_csv(_write(tmp_path, table))
    assert str(refused.value) == (f"column 'avg@32' holds accuracies, fractions in [0, 1], but row 4 (of {len(table)}) "
                                  "has 1.05; divide the column by 100 if it holds percentages")
