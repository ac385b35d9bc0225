"""Multiplicity: the summary's claims are tested in declared families, and one stated error
guarantee holds for the whole list of claims (claims.csv), not for each sentence alone.

Families (``FAMILIES``): ``attribution`` (Shapley values, or main effects where Shapley values
cannot be defended), ``interactions`` (two-factor interactions or their alias chains),
``order`` (gain when added last minus when added first), ``steps`` (gains between observed
neighbouring cells, for designs that are not factorials); a transfer study adds ``transfer``
(technique x setting tests) and ``flips`` (sign changes between settings), and pools each of the
others over its settings, so that one guarantee covers every row of its claims.csv.

Within a family the raw p-values are adjusted by Holm (default), Benjamini-Hochberg or not at
all; across the F families that have tests each adjusted value is then multiplied by F
(Bonferroni over families). A claim needs p_adjusted < alpha. What that guarantees:

- ``holm``: the family-wise error rate over the whole list is at most alpha: the chance that
  one or more claims are false is at most alpha, whatever is true (strong control);
- ``bh``: the false discovery rate over the whole list is at most alpha: the expected share of
  false claims among the claims (each family's FDR is at most alpha / F, and the list's FDR is at
  most their sum); any single list may hold more false claims than under Holm;
- ``none``: raw p-values, each sentence at alpha on its own; the list as a whole has no guarantee.

One run per cell (Lenth's method): the effects' experiment-wise rule is Lenth's simultaneous
margin of error over all m effects, in p-value form the Sidak adjustment 1 - (1 - p)^m, and it
takes the family's share alpha / F like any other family: the bar an effect must pass is
``lenth_bar`` (SME at level alpha / F), which is what the summary prints. ``per_effect_tests``
replaces it with the family's own adjustment of the per-effect Lenth t tests.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

ADJUSTMENTS = ("holm", "bh", "none")
FAMILIES = ("attribution", "interactions", "order", "steps")


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count).

    Example: p = (.01, .04, .03) -> sorted .01, .03, .04 times 3, 2, 1 = .03, .06, .04, made
    monotone -> .03, .06, .06; back in order (.03, .06, .06).
    """
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = p[order] * (len(order) - np.arange(len(order)))
    out[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return out


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values); NaN stays NaN and does not count.

    Example: p = (.01, .04, .03) -> sorted .01, .03, .04 times 3/1, 3/2, 3/3 = .03, .045, .04,
    made monotone from the top -> .03, .04, .04; back in order (.03, .04, .04).
    """
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    count = len(order)
    scaled = p[order] * count / np.arange(1, count + 1)
    out[order] = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 1.0)
    return out


def adjust_within(p: np.ndarray, method: str) -> np.ndarray:
    """Adjusted p-values of one family by ``method`` (holm | bh | none)."""
    if method == "holm":
        return holm(p)
    if method == "bh":
        return benjamini_hochberg(p)
    if method == "none":
        return np.asarray(p, dtype=float).copy()
    raise ValueError(f"unknown adjustment {method!r}; use one of {', '.join(ADJUSTMENTS)}")


def sidak(p: np.ndarray, m: int) -> np.ndarray:
    """1 - (1 - p)^m: the p-value form of a simultaneous rule over m tests (Lenth's SME)."""
    p = np.asarray(p, dtype=float)
    return -np.expm1(m * np.log1p(-np.minimum(p, 1.0)))


def across_families(adjusted: np.ndarray, n_families: int, method: str) -> np.ndarray:
    """Bonferroni over families: adjusted * F, capped at 1 (``none``: unchanged)."""
    if method == "none":
        return adjusted
    return np.minimum(np.asarray(adjusted, dtype=float) * max(n_families, 1), 1.0)


def lenth_margins(pse: float, m: int, alpha: float) -> tuple[float, float, float]:
    """(ME, SME, d) of Lenth's method for m effects: ME = t_{1-alpha/2, d} PSE and
    SME = t_{gamma, d} PSE with gamma = (1 + (1-alpha)^(1/m)) / 2, d = m / 3.

    Example (Lenth 1989, m = 15, alpha = .05): d = 5, t_{.975, 5} = 2.571, gamma = .99829,
    t_{gamma, 5} = 5.219.
    """
    d = m / 3
    gamma = (1 + (1 - alpha) ** (1 / m)) / 2
    return float(stats.t.ppf(1 - alpha / 2, d) * pse), float(stats.t.ppf(gamma, d) * pse), d


def lenth_bar(pse: float, d: float, m: int, alpha: float, n_families: int) -> float:
    """The smallest |effect| claimed under Lenth's simultaneous rule at level alpha / F over m
    effects (F = n_families): F * sidak(p, m) < alpha  <=>  p < p* = 1 - (1 - alpha / F)^(1/m),
    so the bar is t_{1 - p*/2, d} PSE. With F = 1 it is Lenth's SME.

    Example (m = 15, d = 5, alpha = .05, F = 3): p* = 1 - (1 - .05/3)^(1/15) = .001120,
    t_{.99944, 5} = 6.70, so the bar is 6.70 PSE (SME at F = 1: 5.22 PSE).
    """
    p_star = -np.expm1(np.log1p(-alpha / max(n_families, 1)) / m)
    return float(stats.t.ppf(1 - p_star / 2, d) * pse)


def bonferroni(p: np.ndarray, count: int) -> np.ndarray:
    """min(1, count * p): simultaneous over ``count`` intervals (NaN stays NaN)."""
    return np.minimum(np.asarray(p, dtype=float) * max(count, 1), 1.0)
