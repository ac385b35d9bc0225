"""Cumulative tables along orderings of the factors, and how a factor's gain depends on order.

An ordering adds factors one at a time from the baseline, like the rows of the DAPO paper's
table; step t is the cell with the first t factors on, and its delta is the gain over step t-1.
Values are cell means ``values[..., 2**k]`` indexed by bitmask (see ``shapley``).
"""

from __future__ import annotations

from itertools import permutations
from math import comb, factorial

import numpy as np

from .shapley import edge_gains, edges_without, popcount, position_weights, shapley_weights
from .table import PAPER_FACTORS, ReportInputError, factor_label

MAX_FACTORS_ALL_ORDERINGS = 7  # 7! = 5040 orderings x 8 rows; beyond that the table is unreadable


def ordering_name(path: list[str]) -> str:
    """``OF>CH>SP`` style name of an ordering."""
    return ">".join(factor_label(f) for f in path)


def paper_available(factors: list[str]) -> bool:
    """The paper's ordering needs all five DAPO techniques among the factors."""
    return set(PAPER_FACTORS) <= set(factors)


def _resolve(name: str, factors: list[str]) -> str:
    """A factor given by its name or its short label."""
    by_label = {factor_label(f): f for f in factors}
    if name in factors:
        return name
    if name in by_label:
        return by_label[name]
    raise ReportInputError(f"ordering names unknown factor '{name}'; use one of: {', '.join(factors)}")


def resolve_orderings(
    orderings: str | list[list[str]], factors: list[str]
) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Turn ``"paper"``, ``"all"`` or a list of factor lists into named paths, plus notes.

    ``paper`` is the paper's order (named ``paper``) when all five DAPO techniques are factors;
    otherwise the factors in the given order, named ``given``, with a note. Under ``all``, the
    ordering equal to the paper's keeps the name ``paper``. A custom path may stop before the
    last factor; it may not repeat one.
    """
    notes: list[str] = []
    if orderings == "paper":
        if paper_available(factors):
            return [("paper", list(PAPER_FACTORS))], notes
        notes.append(
            "The factors are not DAPO's five techniques, so the cumulative table follows the given factor order."
        )
        return [("given", list(factors))], notes
    if orderings == "all":
        if len(factors) > MAX_FACTORS_ALL_ORDERINGS:
            raise ReportInputError(
                f"--orderings all with {len(factors)} factors means {factorial(len(factors))} orderings; "
                "list the orderings you want instead"
            )
        named = []
        for path in permutations(factors):
            is_paper = list(path) == list(PAPER_FACTORS)
            named.append(("paper" if is_paper else ordering_name(list(path)), list(path)))
        return named, notes
    if isinstance(orderings, str):
        raise ReportInputError(f"--orderings '{orderings}' is not paper, all, or a list like 'a,b;b,a'")
    named = []
    for raw in orderings:
        path = [_resolve(name, factors) for name in raw]
        if len(set(path)) != len(path) or not path:
            raise ReportInputError(
                f"ordering {','.join(raw)} repeats a factor or is empty; list each factor once"
            )
        named.append(("paper" if path == list(PAPER_FACTORS) else ordering_name(path), path))
    return named, notes


def comparisons_at(k: int, position: str) -> int:
    """How many distinct cell comparisons v(S + i) - v(S) lie behind a factor's gain at
    ``position`` ("1".."k", or "all" over every ordering): the C(k-1, p-1) sets S of p-1 other
    factors, each shared by (p-1)! (k-p)! orderings; "all" uses all 2^(k-1). Positions 1 and k are
    one comparison each (onto the baseline; onto all the others), however many orderings share it.
    Example, k = 5: positions 1..5 -> 1, 4, 6, 4, 1; all -> 16.
    """
    return 2 ** (k - 1) if position == "all" else comb(k - 1, int(position) - 1)


def path_masks(path: list[str], factors: list[str]) -> np.ndarray:
    """Cells along an ordering: step 0 baseline, step t the first t factors on. Shape [len+1]."""
    masks = [0]
    for name in path:
        masks.append(masks[-1] | 1 << factors.index(name))
    return np.array(masks)


def cumulative_means(values: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean per step, delta per step) along a path: [..., 2**k] -> ([..., steps], [..., steps]).

    delta_t = v(step t) - v(step t-1); delta_0 is NaN. Example: v(none) = .30, v(a) = .36,
    v(ab) = .38 along a>b gives means (.30, .36, .38) and deltas (NaN, .06, .02).
    """
    means = values[..., masks]
    deltas = np.concatenate([np.full(means[..., :1].shape, np.nan), np.diff(means, axis=-1)], axis=-1)
    return means, deltas


def position_summary(values: np.ndarray, factor: int) -> dict[str, np.ndarray]:
    """A factor's gain by the position at which an ordering adds it, and over all orderings.

    values [2**k] (point estimates) -> arrays of length k + 1 (positions 1..k, then "all"):
    mean gain, min and max over the orderings, and the share of orderings with a gain > 0.
    At position p every set S of p-1 other factors is equally likely; over all orderings S has
    the Shapley weight, so the "all" mean is the Shapley value.
    """
    k = int(np.log2(values.shape[-1]))
    gains = edge_gains(values, factor)
    sizes = popcount(edges_without(k, factor))
    rows = {"mean": [], "min": [], "max": [], "share_positive": []}
    weights = [position_weights(k, factor, p) for p in range(1, k + 1)]
    weights.append(shapley_weights(k, sizes))
    for w in weights:
        used = gains[w > 0]
        rows["mean"].append(gains @ w)
        rows["min"].append(used.min())
        rows["max"].append(used.max())
        rows["share_positive"].append(w[gains > 0].sum())
    return {key: np.array(value) for key, value in rows.items()}


def position_means(values: np.ndarray, factor: int) -> np.ndarray:
    """Mean gain by position, then over all orderings: [..., 2**k] -> [..., k + 1] (for CIs)."""
    k = int(np.log2(values.shape[-1]))
    sizes = popcount(edges_without(k, factor))
    weights = [position_weights(k, factor, p) for p in range(1, k + 1)] + [shapley_weights(k, sizes)]
    return edge_gains(values, factor) @ np.stack(weights, axis=-1)
