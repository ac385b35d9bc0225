"""One rule for setting a new estimate beside a stated direction: a prediction another experiment
wrote (``predictions``) and a published technique effect (``published``) are both judged by
``direction_verdict``, so "confirmed" and "agrees" mean the same thing.

A direction is ``positive`` (the term helps), ``negative`` (it hurts) or ``zero`` (no effect). Against the new
estimate's interval at the report's confidence level (two-sided, 1 - alpha):

- ``positive`` / ``negative``: confirmed when the interval excludes zero on the stated side; contradicted when it
  excludes zero on the other side; else inconclusive. A true zero effect is called confirmed or
  contradicted with probability at most alpha / 2 each, per term;
- ``zero``: confirmed when the (1 - 2 alpha) interval lies within +-margin (two one-sided tests at
  alpha, the transfer report's rule), so a real effect of margin or more is called confirmed with
  probability at most alpha; else inconclusive. A stated null is never contradicted: an interval
  that excludes zero says the effect is not zero, not that it is as large as anything was stated.
- ``not enough data``: the experiment has no estimate or no interval for the term.

Each verdict is per term (no adjustment over the terms): with m terms, about alpha / 2 x m true
zero effects are expected to read as confirmed or contradicted by chance; the report says so.

Settings are matched on their attributes (``core.contracts.SETTING_ATTRIBUTES``): a stated
setting matches one whose every attribute it names is known and equal (one of them, where a list
is stated; text compared case-insensitively).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats

from dapo_ablate.core.contracts import SETTING_ATTRIBUTES, SettingInfo

CONFIRMED, CONTRADICTED, INCONCLUSIVE, NO_DATA = "confirmed", "contradicted", "inconclusive", "not enough data"
VERDICTS = (CONFIRMED, CONTRADICTED, INCONCLUSIVE, NO_DATA)
POSITIVE, NEGATIVE, NULL = "positive", "negative", "zero"
DIRECTIONS = (POSITIVE, NEGATIVE, NULL)


def direction_of(ci_low: float, ci_high: float) -> str:
    """The direction an interval shows: positive above zero, negative below, zero when it holds zero."""
    return POSITIVE if ci_low > 0 else NEGATIVE if ci_high < 0 else NULL


def equivalence_interval(estimate: float, se: float, df: float, alpha: float) -> tuple[float, float]:
    """The (1 - 2 alpha) interval two one-sided tests at alpha read (t on the term's own df)."""
    half = float(stats.t.ppf(1 - alpha, df)) * se if se > 0 and df > 0 else float("nan")
    return estimate - half, estimate + half


def direction_verdict(direction: str, ci_low: float, ci_high: float, equivalent: tuple[float, float], margin: float) -> str:
    """The verdict on a stated direction (module docstring); ``equivalent``: the new estimate's
    (1 - 2 alpha) interval, read only for a stated ``zero``."""
    if not (np.isfinite(ci_low) and np.isfinite(ci_high)):
        return NO_DATA
    if direction == NULL:
        low, high = equivalent
        return CONFIRMED if np.isfinite(low) and -margin < low and high < margin else INCONCLUSIVE
    shown = direction_of(ci_low, ci_high)
    if shown == NULL:
        return INCONCLUSIVE
    return CONFIRMED if shown == direction else CONTRADICTED


def _same(stated: Any, known: Any) -> bool:
    options = stated if isinstance(stated, (list, tuple)) else [stated]
    return any(str(option).strip().lower() == str(known).strip().lower() for option in options)


def setting_matches(stated: Mapping[str, Any], info: SettingInfo) -> bool:
    """Whether ``info`` is a setting ``stated`` (attributes by name; None: any) describes."""
    known = info.attributes()
    return all(
        known[name] is not None and _same(stated[name], known[name])
        for name in SETTING_ATTRIBUTES
        if stated.get(name) not in (None, [], ())
    )
