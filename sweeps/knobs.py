"""How a knob value reads wherever a person reads it: the sweep's console lines (each trial's
setting, the best trial), the report's pages and its figures' ticks. One rule: rounded to the
fewest significant digits (2 to 4) that keep the study's values of the knob apart
(``knob_digits``), small and large values in short scientific notation (``knob_text``).

The study and its CSVs keep the values at full precision; only their text is rounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

KNOB_DIGITS = (2, 4)
"""Fewest and most significant digits a knob value is shown with."""


def is_missing(value: Any) -> bool:
    """None, NaN or pandas' NA (a trial that did not sample the knob, an empty cell)."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def knob_digits(values: Iterable[Any]) -> int:
    """The fewest significant digits (within `KNOB_DIGITS`) at which a knob's distinct float
    values stay distinct: 0.31 and 0.3162 read 0.31 and 0.32, 0.312 and 0.314 need 3."""
    floats = {float(v) for v in values if isinstance(v, float) and math.isfinite(v)}
    low, high = KNOB_DIGITS
    for digits in range(low, high):
        if len({knob_text(v, digits) for v in floats}) == len(floats):
            return digits
    return high


def knob_text(value: Any, digits: int = KNOB_DIGITS[0]) -> str:
    """A knob value rounded to `digits` significant digits, trailing zeros dropped, small and
    large ones in short scientific notation: 0.00031622776601683794 -> ``3.2e-4``,
    0.30000000000000004 -> ``0.3``, 12 -> ``12``; "" when missing."""
    if is_missing(value):
        return ""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(value)))
    if exponent < -2 or exponent >= 5:
        mantissa, power = f"{value:.{digits - 1}e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
        return f"{mantissa}e{int(power)}"
    decimals = max(digits - 1 - exponent, 0)
    text = f"{round(value, decimals):.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def params_digits(settings: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Per knob, the digits (``knob_digits``) that keep its values across `settings` (the
    study's trials' params) apart."""
    values: dict[str, list[Any]] = {}
    for params in settings:
        for knob, value in params.items():
            values.setdefault(knob, []).append(value)
    return {knob: knob_digits(seen) for knob, seen in values.items()}


def format_params(params: Mapping[str, Any], digits: Mapping[str, int] | None = None) -> str:
    """``eps_high=0.31 lr=4.1e-4``: each knob's value through ``knob_text`` at its `digits`
    (``params_digits`` of the study's trials, as the report rounds them; default the fewest)."""
    digits = digits or {}
    return " ".join(f"{knob}={knob_text(value, digits.get(knob, KNOB_DIGITS[0]))}" for knob, value in params.items())
