"""What the ledger stores for a run's result: its columns checked and defaulted (`result_values`)
and any value turned into strict JSON (`to_json`: numpy / torch scalars as numbers, NaN and inf
as null, other objects refused), so that a result the ledger cannot hold fails at once (ValueError,
TypeError) instead of corrupting a row.

The same check reads rows back (`result_problem`): a result stored before the check existed (an
older dapo-ablate, or a hand edit) whose metrics are not a mapping of numbers is never counted as
a finished run."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from dapo_ablate.core.contracts import COMPUTE_COLUMNS, METRIC_PATTERN, RunRecord

RESULT_DEFAULTS: dict[str, Any] = {key: value for key, value in RunRecord({}).result_dict().items() if key != "metrics"}
"""The result keys besides ``metrics`` and their values when a cell function leaves them out
(`RunRecord`'s defaults)."""

METRICS_RULE = "a run result needs `metrics`, a non-empty mapping of metric name -> number (null for a value that could not be computed)"


def _is_number(value: Any) -> bool:
    """An int or float (NaN included: it is stored as null), a numpy / torch scalar of one, or
    None (a NaN as the ledger gives it back); not a bool, a string or a container."""
    if value is None:
        return True
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        try:
            value = value.item()
        except (TypeError, ValueError):  # an array of several values
            return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metrics_problem(metrics: Any) -> str | None:
    """Why `metrics` cannot be a finished run's metrics, or None if it can."""
    if not isinstance(metrics, Mapping) or not metrics:
        return f"{METRICS_RULE}; got {_shown(metrics)}"
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            return f"{METRICS_RULE}; got the name {name!r}"
        if not _is_number(value):
            return f"{METRICS_RULE}; got {name}: {_shown(value)}"
        if METRIC_PATTERN.match(name) and value is not None and not 0 <= _plain(value) <= 1:
            return f"{name} is an accuracy, a fraction in [0, 1]; got {_shown(_plain(value))}"
    return None


def _plain(value: Any) -> float:
    return float(value.item() if hasattr(value, "item") and not isinstance(value, (int, float)) else value)


COUNTS = COMPUTE_COLUMNS
"""A result's compute columns (counts of tokens and seconds): numbers of 0 or more."""


def result_problem(result: Mapping[str, Any]) -> str | None:
    """Why a result (as given to `finish`, or as stored) is not a finished run's result, or None:
    its metrics (`metrics_problem`), an evaluation curve or signals that are not lists of
    mappings, or a token count or wall time that is not a finite number of 0 or more."""
    problem = metrics_problem(result.get("metrics"))
    if problem is not None:
        return problem
    for key in COUNTS:
        value = result.get(key)
        if value is not None and not (_is_number(value) and math.isfinite(_plain(value)) and _plain(value) >= 0):
            return f"a run result's `{key}` must be a number of 0 or more; got {_shown(value)}"
    for key in ("eval_curve", "signals"):
        rows = result.get(key)
        if rows is None:
            continue
        if not isinstance(rows, (list, tuple)) or not all(isinstance(row, Mapping) for row in rows):
            return f"a run result's `{key}` must be a list of mappings (one per step); got {_shown(rows)}"
    return None


def result_values(result: dict[str, Any]) -> dict[str, Any]:
    """The result's stored columns, defaulted; ValueError for unknown keys, metrics that are not a
    non-empty mapping of numbers, or curves that are not lists of mappings."""
    unknown = set(result) - set(RESULT_DEFAULTS) - {"metrics"}
    if unknown:
        raise ValueError(f"unknown result keys {sorted(unknown)}; expected metrics and "
                         f"{sorted(RESULT_DEFAULTS)}")
    problem = result_problem(result)
    if problem is not None:
        raise ValueError(problem)
    values = {**RESULT_DEFAULTS, **result}
    values["tokens_generated"] = int(values["tokens_generated"])
    values["tokens_discarded"] = int(values["tokens_discarded"])
    values["wall_s"] = float(values["wall_s"])
    return values


def _shown(value: Any) -> str:
    """A short, one-line picture of a value a user may have planted (never its whole text)."""
    text = json.dumps(value, default=lambda v: type(v).__name__)[:60] if _json_like(value) else type(value).__name__
    return " ".join(text.split())


def _json_like(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, list, tuple, dict))


def _json_safe(value: Any) -> Any:
    """JSON-able copy of `value`: NaN/inf -> None, numpy/torch scalars -> Python numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if hasattr(value, "item"):  # numpy / torch scalar
        return _json_safe(value.item())
    raise TypeError(f"cannot store a {type(value).__name__} in the ledger: {value!r}")


def to_json(value: Any) -> str:
    """The ledger engine's JSON serializer (see `_json_safe`)."""
    return json.dumps(_json_safe(value), allow_nan=False)
