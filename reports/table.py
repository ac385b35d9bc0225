"""The tidy results table that reports read, and its validation at the edge.

One row per finished run: one 0/1 column per factor (0 = off, 1 = on), ``seed``, one or more
metric columns (``avg@32``, ...) and, when known, the compute columns ``tokens_generated``
(every generated token, including those dynamic sampling discarded), ``tokens_discarded`` and
``wall_s``. Accuracy metrics are stored as fractions in [0, 1]; displays may show them as
percentage points, like the DAPO paper.

A results CSV is read only when it is a regular file within MAX_RESULTS_BYTES and MAX_LINE_BYTES
(a FIFO would block, /dev/zero never ends); each refusal is one ReportInputError sentence.

A cell is one combination of factor levels. Inside the reports a cell is a bitmask over the
factor list: bit ``i`` is factor ``factors[i]``, so the baseline is 0 and the full cell ``2**k - 1``.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from dapo_ablate.core.contracts import (
    COMPUTE_COLUMNS, DEFAULT_METRIC, MAX_FACTORS, METRIC_PATTERN, SEED_COLUMN, SETTING_COLUMN, SHORT_LABELS,
)
from dapo_ablate.core.contracts import TECHNIQUES as PAPER_FACTORS  # re-exported: DAPO's five, the paper's order
from dapo_ablate.core.config_errors import not_a_file_error, not_a_file_mode, one_line, shown_path, shown_value

PAPER_AIME_AVG32 = (30, 36, 38, 41, 42, 50)
"""The paper's cumulative AIME 2024 avg@32 (percentage points, Qwen2.5-32B, one run per row):
naive GRPO, then +OF, +CH, +SP, +TL, +DS."""


class ReportInputError(ValueError):
    """A results table the reports cannot use; the message names the column or cell and the fix."""


def factor_label(factor: str) -> str:
    """Short display label: OF, CH, SP, TL, DS for DAPO's techniques, the name otherwise."""
    return SHORT_LABELS.get(factor, factor)


def is_paper_design(factors: list[str]) -> bool:
    """True when the factors are exactly DAPO's five techniques (in any order)."""
    return sorted(factors) == sorted(PAPER_FACTORS)


def cell_label(mask: int, factors: list[str]) -> str:
    """``OF+CH`` style label of a cell; ``GRPO`` (DAPO's five) or ``baseline`` when all are off."""
    on = [factor_label(f) for i, f in enumerate(factors) if mask >> i & 1]
    if on:
        return "+".join(on)
    return "GRPO" if is_paper_design(factors) else "baseline"


def describe_cell(mask: int, factors: list[str]) -> str:
    """Full description of a cell for error messages: ``a=1, b=0 (a)``."""
    levels = ", ".join(f"{f}={mask >> i & 1}" for i, f in enumerate(factors))
    return f"{levels} ({cell_label(mask, factors)})"


def cell_masks(results: pd.DataFrame, factors: list[str]) -> np.ndarray:
    """Bitmask of each row's cell: sum_i level_i * 2**i. Shape [rows]."""
    levels = results[factors].to_numpy(dtype=np.int64)
    return levels @ (1 << np.arange(len(factors), dtype=np.int64))




def _listed(names: list[str], limit: int = 8) -> str:
    """``a, b, c`` or ``a, ..., h and 12 more``."""
    shown = ", ".join(map(str, names[:limit]))
    return f"{shown} and {len(names) - limit} more" if len(names) > limit else shown


def _check_factor_count(factors: list[str], inferred: bool) -> None:
    """ReportInputError, before any work, for more than MAX_FACTORS factors."""
    if len(factors) <= MAX_FACTORS:
        return
    what = f"{len(factors)} columns look like factors" if inferred else f"{len(factors)} factors"
    raise ReportInputError(
        f"{what} ({_listed(factors)}), and a report analyses at most {MAX_FACTORS} ({2**MAX_FACTORS:,} cells; each "
        f"further factor doubles the work); pass --factors with the {MAX_FACTORS} or fewer to analyse"
    )


NOT_FACTORS = ("run_id", SETTING_COLUMN, "step")
"""Columns never read as factors, besides the seed, the metric and the compute columns."""
LEVEL_SETS = ((0, 1), (-1, 1))
"""Accepted codings of a factor: 0 (off) / 1 (on), or -1 (off) / +1 (on)."""


def _factor_like(values: pd.Series) -> bool:
    """A column that codes two levels, allowing at most max(1, 10%) rows of other values (which
    validation then reports by name instead of silently dropping the factor)."""
    if values.dtype == bool:
        return values.nunique() == 2
    if not pd.api.types.is_numeric_dtype(values):
        return False
    allowed = max(1, len(values) // 10)
    for levels in LEVEL_SETS:
        inside = values.isin(levels)
        if (
            len(values) - inside.sum() <= allowed
            and inside.sum() > len(values) / 2
            and all((values == level).any() for level in levels)
        ):
            return True
    return False


def infer_factors(results: pd.DataFrame, metric: str) -> list[str]:
    """The columns of a results table that code a two-level factor, in column order.

    Excluded: ``seed``, the metric, the compute columns, ``run_id``/``setting``/``step``, any
    column whose name contains ``@`` (other metrics such as ``pass@32``, which can be all 0/1 in
    tiny runs), and constant columns (a factor needs both levels). A column coded 0/1 or -1/+1
    with a stray value is kept, so that validation names the stray value.
    """
    skip = {SEED_COLUMN, metric, *COMPUTE_COLUMNS, *NOT_FACTORS}
    return [
        str(column)
        for column in results.columns
        if column not in skip and "@" not in str(column) and _factor_like(results[column])
    ]


def _require_columns(results: pd.DataFrame, factors: list[str], metric: str) -> None:
    if metric not in results.columns:
        candidates = [c for c in results.columns if "@" in str(c)] or list(results.columns)
        raise ReportInputError(
            f"metric column '{metric}' is missing; pass --metric with one of: "
            + ", ".join(map(str, candidates))
        )
    if SEED_COLUMN not in results.columns:
        raise ReportInputError(
            f"column '{SEED_COLUMN}' is missing; add it (use 0 on every row if each cell ran once)"
        )
    if not factors:
        raise ReportInputError(
            "no factor columns found; add one 0/1 column per factor or pass --factors a,b,..."
        )
    if len(set(factors)) != len(factors):
        raise ReportInputError(f"factor list {factors} names a column twice; list each factor once")
    for factor in factors:
        if factor not in results.columns:
            raise ReportInputError(
                f"factor column '{factor}' is missing; add it or pass --factors with the columns to use"
            )
        if factor in (SEED_COLUMN, metric):
            raise ReportInputError(f"'{factor}' cannot be both a factor and the seed or metric column")


def _level_error(results: pd.DataFrame, factor: str, values: pd.Series) -> ReportInputError:
    """The first value of ``factor`` outside its likelier coding (0/1 or -1/+1), named by row."""
    coding = max((values.isin(s).sum(), s) for s in LEVEL_SETS)[1]
    bad = values[~values.isin(coding)]
    row, value = bad.index[0], bad.iloc[0]
    what = "is empty" if pd.isna(value) else f"has level {_cell_text(value)}"
    other = "-1/+1" if coding == (0, 1) else "0/1"
    return ReportInputError(
        f"factor column '{factor}' {what} (data row {row + 1}, seed {results.at[row, SEED_COLUMN]}); code each factor "
        f"{coding[0]}/{coding[1] if coding == (0, 1) else '+1'} (or {other}) in every row, or pass --factors "
        f"without '{factor}'"
    )


def _check_levels(results: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """Each factor coded 0/1 or -1/+1 with both levels present; returns a copy coded 0/1."""
    clean = results.copy()
    for factor in factors:
        values = clean[factor]
        if values.dtype == bool:
            values = values.astype(int)
        levels = next((s for s in LEVEL_SETS if values.isin(s).all()), None)
        if levels is None:
            raise _level_error(results, factor, values)
        if values.nunique() < 2:
            raise ReportInputError(
                f"factor column '{factor}' is {values.iloc[0]} in every row; a factor needs runs at both levels, "
                f"so drop '{factor}' from --factors or run its other level"
            )
        clean[factor] = (values == levels[1]).astype(int)
    return clean


def _row_cell(results: pd.DataFrame, factors: list[str], row) -> str:
    """Description of the cell of one row (by index label)."""
    return describe_cell(int(sum(int(results.at[row, f]) << i for i, f in enumerate(factors))), factors)


def _in_setting(results: pd.DataFrame, row) -> str:
    """`` in setting 'x'`` for a transfer study's row, else empty."""
    return f" in setting '{results.at[row, SETTING_COLUMN]}'" if SETTING_COLUMN in results.columns else ""


MAX_METRIC_MAGNITUDE = 1e15
"""Largest |metric| the reports accept: a score is far smaller, and the Welch-Satterthwaite df
square the variances (fourth powers of the metric), which overflow to inf from about 1e77."""


def _check_accuracy_range(results: pd.DataFrame, metric: str) -> None:
    """An accuracy (avg@k, pass@k, maj@k) is a fraction in [0, 1]: in a column of fractions (most
    values in [0, 1]) one value outside would switch every page of the report to raw numbers
    without a word, so it is refused naming its row. (A column with most values outside is read in
    its own unit, as any metric.)"""
    if not METRIC_PATTERN.match(metric):
        return
    inside = results[metric].between(0, 1)
    outside = results.index[~inside]
    if len(outside) and inside.mean() > 0.5:
        row, value = int(outside[0]), results.loc[outside[0], metric]
        hint = "; divide the column by 100 if it holds percentages" if results[metric].between(0, 100).all() else ""
        raise ReportInputError(
            f"column '{metric}' holds accuracies, fractions in [0, 1], but row {row + 1} (of {len(results)}) has "
            f"{value:g}{f' and {len(outside) - 1} other rows are outside it too' if len(outside) > 1 else ''}{hint}")


def _check_metric(results: pd.DataFrame, factors: list[str], metric: str) -> None:
    values = pd.to_numeric(results[metric], errors="coerce")
    huge = values.abs().gt(MAX_METRIC_MAGNITUDE) & ~np.isinf(values.fillna(0))
    for bad, what, fix in (
        (values.isna(), "empty or not a number", "drop those runs or fill in their results"),
        (np.isinf(values.fillna(0)), "infinite", "drop those runs or fix their results (a diverged run is a failed run)"),
        (huge, f"{values[huge].iloc[0] if huge.any() else 0:.3g}", f"values beyond +-{MAX_METRIC_MAGNITUDE:.0e} overflow "
         "the variance arithmetic and are no score, so fix or drop that run (an accuracy is a fraction in [0, 1])"),
    ):  # fmt: skip
        if bad.any():
            first = results.index[bad][0]
            more = f" (and {int(bad.sum()) - 1} more rows)" if bad.sum() > 1 else ""
            raise ReportInputError(
                f"metric column '{metric}' is {what} in cell {_row_cell(results, factors, first)}, "
                f"seed {results.at[first, SEED_COLUMN]}{_in_setting(results, first)}{more}; {fix}"
            )


def _check_compute(results: pd.DataFrame, factors: list[str]) -> None:
    """Each compute column present holds non-negative finite numbers or blanks (unknown)."""
    for column in COMPUTE_COLUMNS:
        if column not in results.columns:
            continue
        values = pd.to_numeric(results[column], errors="coerce")
        bad = (values.isna() & results[column].notna()) | np.isinf(values.fillna(0)) | values.lt(0)
        if bad.any():
            first = results.index[bad.to_numpy()][0]
            what = "not a number" if pd.isna(values[first]) else "infinite" if np.isinf(values[first]) else "negative"
            raise ReportInputError(
                f"compute column '{column}' is {what} ({_cell_text(results.at[first, column])}) in cell "
                f"{_row_cell(results, factors, first)}, seed {results.at[first, SEED_COLUMN]}{_in_setting(results, first)}; "
                "fix it or leave it empty (a count of tokens or seconds, 0 or more)"
            )


def _names(columns: list[str]) -> str:
    quoted = [f"'{c}'" for c in columns]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _check_confounded(results: pd.DataFrame, factors: list[str]) -> None:
    """Two factors switched on and off together (equal columns) or against each other (opposite
    columns) in every row have effects no design analysis can separate: refuse, naming them all.
    ``results`` is coded 0/1."""
    by_column: dict[bytes, list[str]] = {}
    for factor in factors:
        by_column.setdefault(results[factor].to_numpy(np.int8).tobytes(), []).append(factor)
    for column, same in by_column.items():
        opposite = by_column.get(bytes(1 - b for b in column), [])
        if len(same) > 1:
            raise ReportInputError(
                f"factor columns {_names(same)} are equal in every row (each run has them all on or all off), so their "
                "effects cannot be told apart; run cells that switch them separately, or pass --factors with one of them"
            )
        if opposite:
            raise ReportInputError(
                f"factor columns {_names(same + opposite)} are opposite in every row (one is on exactly when the other "
                "is off), so their effects cannot be told apart; run cells that switch them separately, or pass "
                "--factors with one of them"
            )


def _cell_text(value: object) -> str:
    """A cell's value as a sentence echoes it: text quoted, on one line and cut (`shown_value`), a
    number as the table writes it (-1.5, not np.float64(-1.5))."""
    return shown_value(value) if isinstance(value, str) else str(value)


def _values_text(values: pd.Series) -> str:
    """``'no' and 'yes'``, ``1 and blanks``: the distinct values of a two-level-looking column."""
    shown = [f"{v:g}" if isinstance(v, float) else _cell_text(v) for v in values.dropna().unique()]
    return " and ".join(sorted(shown) + (["blanks"] if values.isna().any() else []))


def _uncoded_factor(results: pd.DataFrame, factors: list[str], metric: str, rows: pd.Index) -> str | None:
    """A column that tells the duplicated ``rows`` apart and holds two values (blank counting as
    one) in the whole table: a factor coded yes/no or 1/blank, which inference could not read."""
    skip = {SEED_COLUMN, metric, *COMPUTE_COLUMNS, *NOT_FACTORS, *factors}
    for column in results.columns:
        if column in skip or "@" in str(column) or results[column].nunique(dropna=False) != 2:
            continue
        if results.loc[rows, column].nunique(dropna=False) > 1:
            return str(column)
    return None


def _check_duplicates(results: pd.DataFrame, factors: list[str], metric: str) -> None:
    within = [SETTING_COLUMN] if SETTING_COLUMN in results.columns else []  # a transfer study: per setting
    key = [*within, *factors, SEED_COLUMN]
    duplicated = results.duplicated(key, keep=False)
    if not duplicated.any():
        return
    first = results.index[duplicated.to_numpy()][0]
    rows = results.index[(results[key] == results.loc[first, key]).all(axis=1).to_numpy()]
    where, seed = _in_setting(results, first), results.at[first, SEED_COLUMN]
    cell = _row_cell(results, factors, first)
    column = _uncoded_factor(results, factors, metric, rows)
    if column is not None:
        raise ReportInputError(
            f"cell {cell} has more than one row for seed {seed}{where}, and column '{column}' tells them apart but is "
            f"not coded 0/1 (it holds {_values_text(results[column])}); code '{column}' 0/1 (or -1/+1) in every row, "
            "blanks included, to make it a factor"
        )
    raise ReportInputError(
        f"cell {cell} has more than one row for seed {seed}{where}; keep one run per cell and seed"
    )


def validate_results(results: pd.DataFrame, factors: list[str], metric: str) -> pd.DataFrame:
    """Check a results table and return a clean copy (factors as int 0/1, metric as float).

    Raises ReportInputError, one sentence naming the column or cell and the fix, for: more than
    MAX_FACTORS factors (checked first, before any work); a compute column as the metric; a missing metric, seed or factor column; factor levels other than 0/1
    or -1/+1 (accepted and recoded 0/1); a constant factor; an empty (NaN), infinite, huge
    (beyond MAX_METRIC_MAGNITUDE) or non-numeric metric; two rows for the same cell and seed
    (naming the column that tells them apart when it looks like a factor coded otherwise); two
    factors equal or opposite in every row; a compute column that is not a non-negative number.
    """
    if len(results) == 0:
        raise ReportInputError("the results table has no rows; run the experiment or pass another CSV")
    if metric in COMPUTE_COLUMNS:
        raise ReportInputError(
            f"--metric {metric} names a compute column, not an outcome; report on a metric column such as "
            "avg@32 (compute per cell is in compute.csv)"
        )
    _check_factor_count(factors, inferred=False)
    _require_columns(results, factors, metric)
    clean = _check_levels(results.reset_index(drop=True), factors)  # a fresh index: rows by position
    if clean[SEED_COLUMN].isna().any():
        raise ReportInputError(f"column '{SEED_COLUMN}' has empty values; give every run its seed")
    _check_metric(clean, factors, metric)
    clean[metric] = pd.to_numeric(clean[metric]).astype(float)
    _check_accuracy_range(clean, metric)
    _check_duplicates(clean, factors, metric)
    _check_confounded(clean, factors)
    _check_compute(clean, factors)
    return clean


MAX_RESULTS_BYTES = 64 * 2**20
"""Largest results CSV: 64 MiB is about a million runs; a larger file is a mistake that would be
parsed whole, at several times its size in memory."""
MAX_LINE_BYTES = 2**20
"""Longest line of a results CSV: a run's row is a few hundred bytes."""


def _open_results(path: Path):
    """``path`` opened for binary reading once it is known to be a regular file no larger than
    MAX_RESULTS_BYTES (checked on the open descriptor: O_NONBLOCK keeps a FIFO from blocking the
    open); ReportInputError otherwise. Nothing is read."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise ReportInputError(f"{_named(path)} {not_a_file_error(error, path, 'check the --results path')}") from None
    info = os.fstat(descriptor)
    problem = not_a_file_mode(info.st_mode)
    if problem:
        problem += "; pass the results CSV file itself"
    elif info.st_size > MAX_RESULTS_BYTES:
        problem = _too_large()
    if problem:
        os.close(descriptor)
        raise ReportInputError(f"{_named(path)} {problem}")
    return os.fdopen(descriptor, "rb")


def _named(path: Path) -> str:
    """How a results-file sentence names the file: whole, quoted, on one line."""
    return f"results file {shown_path(path)}"


def _too_large() -> str:
    return f"is over {MAX_RESULTS_BYTES // 2**20} MiB; a results table is one short row per run, so check the file"


def _read_results_bytes(path: Path) -> bytes:
    """The whole file, read one line at a time so that neither a line over MAX_LINE_BYTES nor a
    file grown past MAX_RESULTS_BYTES since it was opened is ever held (ReportInputError)."""
    lines, total = [], 0
    with _open_results(path) as handle:
        while line := handle.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES:
                raise ReportInputError(
                    f"{_named(path)} line {len(lines) + 1} is longer than {MAX_LINE_BYTES // 2**20} MiB; "
                    "a run's row is a few hundred bytes, so check that the file is a results CSV"
                )
            total += len(line)
            if total > MAX_RESULTS_BYTES:
                raise ReportInputError(f"{_named(path)} {_too_large()}")
            lines.append(line)
    return b"".join(lines)


def read_results_csv(path: str | Path) -> pd.DataFrame:
    """The results CSV at ``path`` as a DataFrame, unvalidated; ReportInputError (one sentence
    naming the file) for a missing, unreadable, special, oversized or malformed file."""
    path = Path(path)
    raw = _read_results_bytes(path)
    try:
        return pd.read_csv(io.BytesIO(raw))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise ReportInputError(f"{_named(path)} is not a readable CSV ({one_line(str(error), 300)}); export it again") from None


def load_results_csv(
    path: str | Path, factors: list[str] | None = None, metric: str = DEFAULT_METRIC
) -> tuple[pd.DataFrame, list[str]]:
    """Read and validate a results CSV; returns ``(results, factors)``.

    ``factors`` defaults to the CSV's 0/1 columns (see ``infer_factors``). The file must be a
    regular file of at most MAX_RESULTS_BYTES with no line over MAX_LINE_BYTES
    (``read_results_csv``); ReportInputError, one sentence, otherwise.
    """
    results = read_results_csv(path)
    if factors is None:
        factors = infer_factors(results, metric)
        _check_factor_count(factors, inferred=True)
    return validate_results(results, list(factors), metric), list(factors)


def validate_curves(curves: pd.DataFrame, factors: list[str], metric: str) -> pd.DataFrame:
    """Check a learning-curves table: factor columns (0/1 or -1/+1), ``seed``, ``step`` and the
    metric (optional: cumulative ``tokens_generated`` at each evaluation)."""
    for column in [*factors, SEED_COLUMN, "step", metric]:
        if column not in curves.columns:
            raise ReportInputError(
                f"curves table lacks column '{column}'; give the factor columns, seed, step and {metric}"
            )
    return _check_levels(curves.reset_index(drop=True), factors)
