"""Group-sequential alpha spending and boundaries (Lan & DeMets 1983): the spending functions,
the two-sided z boundaries of a design at given information fractions, and the probability that
a test stops at each look. ``reports.sequential`` decides the looks of an adaptive factorial on
top of these (its module docstring gives the method); they are apart because they are the pure
numerics, checked against published boundaries (rpact / gsDesign; tests/unit/test_sequential.py).

The joint distribution of the Z statistics is the canonical one (Z_k sqrt(t_k) a Brownian motion
in t), its density carried from look to look on a Simpson grid by recursive numerical
integration (Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, ch. 19).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np
from scipy import optimize, stats


def obrien_fleming(t, alpha: float) -> np.ndarray:
    """Lan-DeMets O'Brien-Fleming-type spending of a two-sided level alpha, alpha / 2 per side:
    2 x (2 - 2 Phi(z_{1 - alpha/4} / sqrt(t))) (gsDesign's sfLDOF, rpact's asOF, two-sided).

    Example: alpha = .05, t = .5: z_{.9875} = 2.2414, / sqrt(.5) = 3.1698, 2 - 2 Phi = .001526
    per side, .003052 in all; t = 1 gives .05."""
    t = np.asarray(t, dtype=float)
    return 2 * (2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 4) / np.sqrt(np.maximum(t, 1e-300))))


def pocock(t, alpha: float) -> np.ndarray:
    """Lan-DeMets Pocock-type spending: alpha ln(1 + (e - 1) t). Example: t = .5, alpha = .05:
    .05 ln(1.859141) = .05 x .620115 = .031006."""
    return alpha * np.log1p((np.e - 1) * np.asarray(t, dtype=float))


SPENDING: dict[str, Callable] = {"obrien_fleming": obrien_fleming, "pocock": pocock}
"""The spending functions by the name `adaptive.spending` uses."""

Z_CAP = 8.5  # P(|Z| > 8.5) < 2e-17: the grid's edge when a look spends (almost) nothing


def _simpson(low: float, high: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """(points, Simpson weights) on [low, high] with an even number of intervals <= step wide."""
    intervals = max(2, int(np.ceil((high - low) / step / 2)) * 2)
    points = np.linspace(low, high, intervals + 1)
    weights = np.ones(intervals + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return points, weights * (high - low) / intervals / 3


def _exit(points, mass, t_prev: float, t_now: float, bound: float, drift: float) -> float:
    """P(continue until look k-1, |Z_k| >= bound): Z_k sqrt(t_k) = Z_{k-1} sqrt(t_{k-1}) + drift
    (t_k - t_{k-1}) + N(0, t_k - t_{k-1}); ``mass`` = density x weight on the previous grid."""
    scale, centre = np.sqrt(t_now - t_prev), points * np.sqrt(t_prev) + drift * (t_now - t_prev)
    edge = bound * np.sqrt(t_now)
    return float(mass @ (stats.norm.cdf((-edge - centre) / scale) + stats.norm.sf((edge - centre) / scale)))


def _carry(points, mass, t_prev: float, t_now: float, bound: float, drift: float):
    """(grid, mass) of Z_k on the continuation region (-bound, bound)."""
    scale = np.sqrt(t_now - t_prev)
    edge = min(bound, Z_CAP)
    new, weights = _simpson(-edge, edge, min(0.02, scale / np.sqrt(t_now) / 8))
    centre = points * np.sqrt(t_prev) + drift * (t_now - t_prev)
    kernel = stats.norm.pdf((new[:, None] * np.sqrt(t_now) - centre[None, :]) / scale) * np.sqrt(t_now) / scale
    return new, (kernel @ mass) * weights


def _first(bound: float, t: float, drift: float):
    """(exit probability, grid, mass) of the first look: Z_1 ~ N(drift sqrt(t_1), 1)."""
    shift = drift * np.sqrt(t)
    exit_probability = float(stats.norm.cdf(-bound - shift) + stats.norm.sf(bound - shift))
    points, weights = _simpson(-min(bound, Z_CAP), min(bound, Z_CAP), 0.02)
    return exit_probability, points, stats.norm.pdf(points - shift) * weights


def _check_fractions(fractions) -> np.ndarray:
    t = np.asarray(fractions, dtype=float)
    if t.ndim != 1 or not len(t) or np.any(t <= 0) or np.any(t > 1 + 1e-12) or np.any(np.diff(t) <= 0):
        raise ValueError(f"information fractions must rise strictly within (0, 1], got {list(t)}")
    return t


def exit_probabilities(bounds, fractions, drift: float = 0.0) -> np.ndarray:
    """P(the test stops at look k) for two-sided boundaries ``bounds`` (z scale) at information
    ``fractions``, when E[Z_k] = drift sqrt(t_k) (drift = theta sqrt(I_max); 0 under H0).
    Their sum is the type I error (drift 0) or the power."""
    t, bounds = _check_fractions(fractions), np.asarray(bounds, dtype=float)
    out = np.zeros(len(t))
    out[0], points, mass = _first(bounds[0], t[0], drift)
    for k in range(1, len(t)):
        out[k] = _exit(points, mass, t[k - 1], t[k], bounds[k], drift)
        points, mass = _carry(points, mass, t[k - 1], t[k], bounds[k], drift)
    return out


@lru_cache(maxsize=4096)
def _boundaries(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    t = _check_fractions(fractions)
    increments = np.diff(np.concatenate([[0.0], SPENDING[spending](t, alpha)]))
    bounds = [float(stats.norm.isf(increments[0] / 2)) if increments[0] > 1e-16 else np.inf]
    _, points, mass = _first(bounds[0], t[0], 0.0)
    for k in range(1, len(t)):
        target = increments[k]

        def excess(c: float, k: int = k) -> float:
            return _exit(points, mass, t[k - 1], t[k], c, 0.0) - target

        if target <= 1e-16 or excess(Z_CAP) >= 0:
            bound = np.inf
        elif excess(1e-6) <= 0:
            bound = 1e-6  # more to spend than the look can: reject at any z (a degenerate schedule)
        else:
            bound = optimize.brentq(excess, 1e-6, Z_CAP, xtol=1e-7)
        bounds.append(float(bound))
        points, mass = _carry(points, mass, t[k - 1], t[k], bound, 0.0)
    return tuple(bounds)


def boundaries(fractions, alpha: float, spending: str = "obrien_fleming") -> np.ndarray:
    """Two-sided z boundaries c_1..c_K of a Lan-DeMets design at information ``fractions``
    (rising within (0, 1]) for level ``alpha``; inf where a look spends nothing.

    Example (O'Brien-Fleming-type, alpha = .05, K = 2 at t = .5, 1): look 1 spends .003052 in
    all (``obrien_fleming``), so c_1 = z_{1 - .001526} = 2.963; look 2 spends the rest, c_2 = 1.969
    (rpact / gsDesign). Cached by (fractions, alpha, spending)."""
    if spending not in SPENDING:
        raise ValueError(f"unknown spending {spending!r}; use one of {', '.join(SPENDING)}")
    key = tuple(round(float(x), 12) for x in np.atleast_1d(fractions))
    return np.array(_boundaries(key, float(alpha), spending))
