"""What the ledger stores for a run's result: its columns checked and defaulted (`result_values`)
and any value turned into strict JSON (`to_json`: numpy / torch scalars as numbers, NaN and inf
as null, other objects refused), so that a result the ledger cannot hold fails at once (ValueError,
TypeError) instead of corrupting a row."""

from __future__ import annotations

import json
import math
from typing import Any

from dapo_ablate.core.contracts import RunRecord

RESULT_DEFAULTS: dict[str, Any] = {key: value for key, value in RunRecord({}).result_dict().items() if key != "metrics"}
"""The result keys besides ``metrics`` and their values when a cell function leaves them out
(`RunRecord`'s defaults)."""


def result_values(result: dict[str, Any]) -> dict[str, Any]:
    """The result's stored columns, defaulted; ValueError for unknown keys or missing metrics."""
    unknown = set(result) - set(RESULT_DEFAULTS) - {"metrics"}
    if unknown:
        raise ValueError(f"unknown result keys {sorted(unknown)}; expected metrics and "
                         f"{sorted(RESULT_DEFAULTS)}")
    if not isinstance(result.get("metrics"), dict):
        raise ValueError("a run result needs `metrics`, a dict of metric name -> value")
    values = {**RESULT_DEFAULTS, **result}
    values["tokens_generated"] = int(values["tokens_generated"])
    values["tokens_discarded"] = int(values["tokens_discarded"])
    values["wall_s"] = float(values["wall_s"])
    return values


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
