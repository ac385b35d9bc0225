"""Across-settings formulas for one term: S independent estimates theta_s, each with its own SE
and df (from its own setting's noise). Pure functions on arrays over the settings; the transfer
analysis (``transfer``) applies them to every term.

- ``welch_heterogeneity``: does the term take one value in every setting? Welch's (1951) test
  for equal means with unequal variances, on the settings' own variances and df;
- ``cochran_q``: the same spread as a description, Q and I^2 (inverse-variance weights);
- ``flip_p``: is one setting's value above zero while another's is below?
- ``pair_difference`` / ``excluded_beyond``: the largest between-setting difference the data
  cannot rule out (every larger one is excluded), for an equivalence (TOST) verdict.

Each has a ``..._many`` form over a leading batch of terms (arrays [..., S]); the scalar forms
call it, so the report and the planning of its verdicts (``transfer_power``) share one formula,
and ``verdicts_of`` is the report's verdict rule over many terms.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
from scipy import stats


def _usable_many(theta: np.ndarray, se: np.ndarray, df: np.ndarray) -> np.ndarray:
    """[...]: whether each term's S values can be compared (S >= 2, every estimate and SE finite,
    every SE and df positive)."""
    if theta.shape[-1] < 2:
        return np.zeros(theta.shape[:-1], dtype=bool)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(theta) & np.isfinite(se) & (se > 0) & (df > 0)
    return ok.all(axis=-1)


def welch_heterogeneity(theta: np.ndarray, se: np.ndarray, df: np.ndarray) -> tuple[float, float, float, float]:
    """(F, df1, df2, p) of Welch's test that every theta_s is equal; NaN without usable inputs.

    w_s = 1 / se_s^2, W = sum w, theta_w = sum w theta / W, A = sum w (theta - theta_w)^2 / (S - 1),
    L = sum (1 - w_s / W)^2 / df_s, F = A / (1 + 2 (S - 2) L / (S^2 - 1)) on (S - 1, (S^2 - 1) / (3 L)).

    Example: theta (0, 2), se (1, 1), df (10, 10): w = (1, 1), theta_w = 1, A = 2, L = 2 (.5^2 / 10)
    = .05, F = 2 on (1, 3 / .15 = 20): Welch's two-sample t^2 = (2 / sqrt 2)^2 with df 20.
    """
    f, df1, df2, p = welch_heterogeneity_many(*(np.asarray(v, dtype=float)[None] for v in (theta, se, df)))
    return float(f[0]), float(df1), float(df2[0]), float(p[0])


def welch_heterogeneity_many(theta: np.ndarray, se: np.ndarray, df: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """``welch_heterogeneity`` of many terms at once: arrays [..., S] (the settings on the last
    axis) -> (F [...], df1, df2 [...], p [...]), NaN where a term's inputs are not usable. The
    one formula behind the report's test and ``transfer_power``'s planning of it."""
    theta, se, df = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (theta, se, df)))
    s = theta.shape[-1]
    usable = _usable_many(theta, se, df)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = 1.0 / se**2
        total = w.sum(axis=-1, keepdims=True)
        centre = (w * theta).sum(axis=-1, keepdims=True) / total
        a = (w * (theta - centre) ** 2).sum(axis=-1) / (s - 1)
        lam = ((1 - w / total) ** 2 / df).sum(axis=-1)
        f = a / (1 + 2 * (s - 2) * lam / (s**2 - 1))
        df2 = np.where(lam > 0, (s**2 - 1) / (3 * lam), np.inf)
        p = stats.f.sf(f, s - 1, df2)
    nan = np.full(theta.shape[:-1], np.nan)
    return np.where(usable, f, nan), float(s - 1), np.where(usable, df2, nan), np.where(usable, p, nan)


def cochran_q(estimates: np.ndarray, se: np.ndarray) -> tuple[float, float]:
    """(Q, I^2) with inverse-variance weights; NaN if any SE is missing or zero.

    Example: estimates (1, 3), se (1, 1): pooled 2, Q = 1 + 1 = 2, I^2 = (2 - 1) / 2 = 0.5.
    """
    if np.isnan(estimates).any() or not (np.isfinite(se).all() and (se > 0).all()):
        return float("nan"), float("nan")
    w = 1.0 / se**2
    pooled = float(w @ estimates / w.sum())
    q = float(w @ (estimates - pooled) ** 2)
    i2 = max(0.0, (q - (len(estimates) - 1)) / q) if q > 0 else 0.0
    return q, i2


def flip_p(theta: np.ndarray, p: np.ndarray) -> tuple[float, int | None, int | None]:
    """(p, positive setting, negative setting) of "one setting's value is above zero and another's
    below": the larger of the smallest two-sided p among positive estimates and among negative
    ones. Both settings' intervals at level 1 - a exclude zero exactly when this p < a, so a
    simultaneous (Bonferroni) adjustment of it is the flip seen on simultaneous intervals.
    1 when every estimate has one sign (no flip to test); NaN when a value is missing.

    Example: theta (.05, -.03, .01), p (.001, .02, .6): positive best .001 (setting 0), negative
    best .02 (setting 1): (.02, 0, 1).
    """
    theta, p = np.asarray(theta, dtype=float), np.asarray(p, dtype=float)
    if np.isnan(theta).any() or np.isnan(p).any():
        return float("nan"), None, None
    positive, negative = np.flatnonzero(theta > 0), np.flatnonzero(theta < 0)
    if not len(positive) or not len(negative):
        return 1.0, None, None
    up, down = int(positive[np.argmin(p[positive])]), int(negative[np.argmin(p[negative])])
    return float(max(p[up], p[down])), up, down


def pair_difference(theta, se, df, a: int, b: int) -> tuple[float, float, float]:
    """(theta_a - theta_b, its SE, Welch-Satterthwaite df) of two independent settings.

    Example: se (.3, .4), df (10, 20): SE = .5, df = .5^4 / (.3^4 / 10 + .4^4 / 20) = 29.9.
    """
    var_a, var_b = se[a] ** 2, se[b] ** 2
    total = var_a + var_b
    with np.errstate(divide="ignore"):  # both df infinite: infinite df
        df_d = total**2 / (var_a**2 / df[a] + var_b**2 / df[b])
    return float(theta[a] - theta[b]), float(np.sqrt(total)), float(df_d)


def difference_interval(theta, se, df, a: int, b: int, level: float) -> tuple[float, float, float]:
    """(difference, low, high): theta_a - theta_b with its two-sided interval at ``level``."""
    d, se_d, df_d = pair_difference(theta, se, df, a, b)
    half = float(stats.t.ppf(0.5 + level / 2, df_d)) * se_d
    return d, d - half, d + half


def excluded_beyond(theta, se, df, alpha: float) -> float:
    """The largest between-setting difference these data cannot exclude at level alpha per side:
    max over pairs of |d| + t_{1 - alpha, df_d} se_d, the far end of each pair's (1 - 2 alpha)
    interval. Every pair's two one-sided tests (TOST) show |difference| < margin exactly when
    this is below the margin (intersection-union: no adjustment over the pairs). NaN when an
    estimate or SE is missing.

    Example: theta (0, .01), se (.005, .005), df inf, alpha .05: d = -.01, se_d = .00707,
    |d| + 1.645 se_d = .0216.
    """
    return float(excluded_beyond_many(*(np.asarray(v, dtype=float)[None] for v in (theta, se, df)), alpha)[0])


def excluded_beyond_many(theta: np.ndarray, se: np.ndarray, df: np.ndarray, alpha: float) -> np.ndarray:
    """``excluded_beyond`` of many terms at once: arrays [..., S] -> [...] (NaN where a
    term's inputs are not usable); each pair's SE and df as ``pair_difference`` gives them."""
    theta, se, df = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (theta, se, df)))
    ends = np.full(theta.shape[:-1], -np.inf)
    for a, b in combinations(range(theta.shape[-1]), 2):
        var_a, var_b = se[..., a] ** 2, se[..., b] ** 2
        total = var_a + var_b
        with np.errstate(divide="ignore", invalid="ignore"):  # both df infinite: infinite df
            df_d = total**2 / (var_a**2 / df[..., a] + var_b**2 / df[..., b])
            end = np.abs(theta[..., a] - theta[..., b]) + stats.t.ppf(1 - alpha, df_d) * np.sqrt(total)
        ends = np.maximum(ends, end)
    return np.where(_usable_many(theta, se, df), ends, np.nan)


def flip_p_many(theta: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``flip_p``'s p of many terms at once: arrays [..., S] -> [...]: the larger of the smallest
    p among positive estimates and among negative ones; 1 with one sign only, NaN when a value is
    missing."""
    theta, p = np.broadcast_arrays(np.asarray(theta, dtype=float), np.asarray(p, dtype=float))
    up = np.where(theta > 0, p, np.inf).min(axis=-1)
    down = np.where(theta < 0, p, np.inf).min(axis=-1)
    out = np.where(np.isinf(up) | np.isinf(down), 1.0, np.maximum(up, down))
    return np.where(np.isnan(theta).any(axis=-1) | np.isnan(p).any(axis=-1), np.nan, out)


def verdicts_of(complete, flip_adjusted, p_adjusted, excluded, margin: float, alpha: float) -> np.ndarray:
    """The transfer report's plain verdict (``transfer``'s module docstring) of many terms at once,
    from each term's adjusted flips and Welch p-values and its ``excluded_beyond``: the rule the
    report applies and ``transfer_power`` plans for."""
    complete, flip_adjusted, p_adjusted, excluded = np.broadcast_arrays(
        np.asarray(complete, dtype=bool), *(np.asarray(v, dtype=float) for v in (flip_adjusted, p_adjusted, excluded))
    )
    return np.select(
        [~complete | np.isnan(p_adjusted), flip_adjusted < alpha, p_adjusted < alpha, excluded < margin],
        ["not enough data", "flips sign", "differs in size", "transfers"],
        "inconclusive",
    )
