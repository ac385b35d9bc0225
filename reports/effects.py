"""Factorial effects as contrasts of the cell means, Lenth's method, and fitted-model cell means.

Coding x_i = 2 * level_i - 1; a term's column is the product of its factors' columns. The
effect of a term is the mean of the cells where its column is +1 minus the mean where it is
-1 (2 x the OLS coefficient): c_T = column_T / (m / 2) over the m cells of a full design or a
regular fraction. In a fraction, a term is aliased with every term whose column equals its
own up to sign: below resolution V the table names the whole chain (``a:b = c:d``), never one
member alone; from resolution V on, the aliases are of order three or more (assumed zero) and
the term keeps its plain name. An
incomplete design gets effects only from a model with main effects and two-factor
interactions (assuming higher-order interactions are zero, and said so), and a design that
cannot separate those (a one-at-a-time path) gets no factorial effects at all: its gains are
path gains (see ``orderings``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .design import DesignInfo, Term, alias_chain, all_terms, contrast_column, contrast_columns, term_name

EFFECT_COLUMNS = ["term", "effect", "se", "ci_low", "ci_high", "p_value", "df", "p_adjusted"]


@dataclass(frozen=True)
class EffectContrasts:
    """Every effect the design can estimate, as rows of a contrast matrix over observed cells."""

    names: list[str]  # "a", "a:b", or an alias chain "a:b = c:d"
    terms: list[Term]  # the fitted (first) term of each
    contrasts: np.ndarray  # [effects, m]
    model_based: bool  # incomplete design: effects assume higher-order interactions are zero

    @property
    def orders(self) -> np.ndarray:
        return np.array([len(t) for t in self.terms])


def lenth_pse(effects: np.ndarray) -> float:
    """Lenth's (1989) pseudo standard error of unreplicated factorial effects.

    s0 = 1.5 * median|c_j|;  PSE = 1.5 * median{ |c_j| : |c_j| < 2.5 * s0 }.
    Example: c = (10, -1, 2, .5, -.2, 1.5, .3): median|c| = 1, s0 = 1.5, the trimmed set drops
    10, its median is (.5 + 1) / 2 = .75, so PSE = 1.125.
    """
    magnitudes = np.abs(np.asarray(effects, dtype=float))
    s0 = 1.5 * np.median(magnitudes)
    trimmed = magnitudes[magnitudes < 2.5 * s0]
    return float(1.5 * np.median(trimmed)) if len(trimmed) else 0.0  # most effects exactly 0: no noise level


def _model_terms(design: DesignInfo) -> list[Term]:
    """Incomplete design: main effects and two-factor interactions if the cells separate them."""
    masks = np.array(design.observed)
    terms = all_terms(design.k, 2)
    x = np.column_stack([np.ones(len(masks))] + [contrast_column(masks, t) for t in terms])
    return terms if np.linalg.matrix_rank(x) == x.shape[1] else []


def effect_contrasts(
    design: DesignInfo, factors: list[str], g: np.ndarray, max_order: int | None = None
) -> EffectContrasts:
    """The estimable effects of ``design`` over its observed cells (``g``: information matrix
    of the cell means, the weights of the model fit for an incomplete design); ``max_order``:
    only terms (a fraction: fitted terms of alias groups) up to that order."""
    masks = np.array(design.observed)
    if design.kind == "full":
        terms = all_terms(design.k, max_order)
        rows = contrast_columns(masks, terms) / (len(masks) / 2)
        return EffectContrasts([term_name(t, factors) for t in terms], terms, rows, False)
    if design.kind == "fraction":
        groups = [group for group in design.alias_groups if max_order is None or len(group[0]) <= max_order]
        rows = contrast_columns(masks, [group[0] for group in groups]) / (len(masks) / 2)
        full_chains = (design.resolution or 0) < 5  # below V every member matters: name them all
        names = [
            alias_chain(group, factors, None if full_chains else 2, signs)
            for group, signs in zip(design.alias_groups, design.alias_signs)
            if max_order is None or len(group[0]) <= max_order
        ]
        return EffectContrasts(names, [group[0] for group in groups], rows, False)
    terms = _model_terms(design)
    if not terms:
        return EffectContrasts([], [], np.zeros((0, len(masks))), True)
    x = np.column_stack([np.ones(len(masks))] + [contrast_column(masks, t) for t in terms])
    coefficients = np.linalg.solve(x.T @ g @ x, x.T @ g)  # GLS: [1 + terms, m]
    return EffectContrasts([term_name(t, factors) for t in terms], terms, 2 * coefficients[1:], True)


def model_prediction_map(design: DesignInfo, g: np.ndarray, max_order: int = 2) -> np.ndarray:
    """Linear map from observed cell means to all 2^k cell means under the fitted model.

    Model: intercept + one term per alias group of order <= max_order, fitted by generalised
    least squares with the information matrix G of the cell means (diag(n) without seed
    blocks, i.e. OLS on the runs). P = X_all (X' G X)^-1 X' G, shape [2**k, m].
    """
    terms = [group[0] for group in design.alias_groups if len(group[0]) <= max_order]
    observed = np.array(design.observed)
    everything = np.arange(2**design.k)
    x_obs = np.column_stack([np.ones(len(observed))] + [contrast_column(observed, t) for t in terms])
    x_all = np.column_stack([np.ones(len(everything))] + [contrast_column(everything, t) for t in terms])
    return x_all @ np.linalg.solve(x_obs.T @ g @ x_obs, x_obs.T @ g)
