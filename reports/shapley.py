"""Shapley and Banzhaf values of the factors, and the per-factor edge gains they average.

The "game" is the cell-mean function v(S) over sets S of factors switched on, stored as an
array ``values[..., 2**k]`` indexed by bitmask (leading axes are bootstrap replicates). Every
function here is linear in ``values``, so it applies unchanged to each replicate.

An *edge* of factor i is a pair (S, S + i) with i not in S; its gain is v(S + i) - v(S). A
weighted sum of factor i's edge gains is one contrast row over the 2^k cells, +w_S at S + i and
-w_S at S (``edge_rows``): the ``*_matrix`` functions build those rows directly, in O(k 2^k),
where applying the statistic to the identity would take O(k 4^k) (12 factors: 4,096 cells).
"""

from __future__ import annotations

from math import comb, factorial

import numpy as np


def edges_without(k: int, factor: int) -> np.ndarray:
    """The 2^(k-1) subsets S (bitmasks) that do not contain ``factor``, increasing."""
    masks = np.arange(2**k)
    return masks[(masks >> factor & 1) == 0]


def popcount(masks: np.ndarray) -> np.ndarray:
    """Number of factors on in each bitmask (non-negative integers), same shape."""
    masks = np.asarray(masks, dtype=np.int64)
    count = np.zeros(masks.shape, dtype=np.int64)
    for bit in range(int(masks.max(initial=0)).bit_length()):
        count += (masks >> bit) & 1
    return count


def edge_gains(values: np.ndarray, factor: int) -> np.ndarray:
    """v(S + i) - v(S) for every S without factor i: [..., 2**k] -> [..., 2**(k-1)]."""
    k = int(np.log2(values.shape[-1]))
    subsets = edges_without(k, factor)
    return values[..., subsets | (1 << factor)] - values[..., subsets]


def shapley_weights(k: int, size: np.ndarray) -> np.ndarray:
    """w(|S|) = |S|! (k - |S| - 1)! / k!: the share of the k! orderings in which i follows exactly S."""
    by_size = np.array([factorial(s) * factorial(k - s - 1) / factorial(k) for s in range(k)])
    return by_size[np.ravel(np.asarray(size, dtype=np.int64))]


def edge_rows(k: int, factor: int, weights: np.ndarray) -> np.ndarray:
    """The contrast rows of weighted sums of ``factor``'s edge gains: weights [..., 2**(k-1)]
    over ``edges_without(k, factor)`` -> rows [..., 2**k] with +w_S at S + i and -w_S at S, so
    that ``values @ rows.T == edge_gains(values, factor) @ weights.T``."""
    subsets = edges_without(k, factor)
    rows = np.zeros((*np.shape(weights)[:-1], 2**k))
    rows[..., subsets | (1 << factor)] = weights
    rows[..., subsets] = -np.asarray(weights)
    return rows


def shapley_matrix(k: int) -> np.ndarray:
    """[k, 2**k]: row i is the Shapley value of factor i as a contrast of the cell means."""
    return np.stack([edge_rows(k, i, shapley_weights(k, popcount(edges_without(k, i)))) for i in range(k)])


def banzhaf_matrix(k: int) -> np.ndarray:
    """[k, 2**k]: row i is the Banzhaf value (main effect) of factor i: +-1 / 2^(k-1)."""
    return np.stack([edge_rows(k, i, np.full(2 ** (k - 1), 1.0 / 2 ** (k - 1))) for i in range(k)])


def shapley_values(values: np.ndarray) -> np.ndarray:
    """phi_i = sum_{S not containing i} w(|S|) [v(S + i) - v(S)]: [..., 2**k] -> [..., k].

    This equals the mean gain of i over all k! orderings, computed from 2^(k-1) edges per factor
    instead of enumerating orderings. Efficiency: sum_i phi_i = v(all) - v(none).
    Example, k = 2, v = (none 0, a 2, b 3, ab 9): phi_a = (2 - 0)/2 + (9 - 3)/2 = 4,
    phi_b = (3 - 0)/2 + (9 - 2)/2 = 5, and 4 + 5 = 9 - 0.
    """
    k = int(np.log2(values.shape[-1]))
    phi = []
    for factor in range(k):
        subsets = edges_without(k, factor)
        phi.append(edge_gains(values, factor) @ shapley_weights(k, popcount(subsets)))
    return np.stack(phi, axis=-1)


def banzhaf_values(values: np.ndarray) -> np.ndarray:
    """beta_i = mean over the 2^(k-1) edges of v(S + i) - v(S): [..., 2**k] -> [..., k].

    This is the classic factorial main effect: mean of the cells with i on minus mean of the
    cells with i off. Example above: beta_a = ((2 - 0) + (9 - 3)) / 2 = 4, beta_b = 5.
    """
    k = int(np.log2(values.shape[-1]))
    return np.stack([edge_gains(values, factor).mean(axis=-1) for factor in range(k)], axis=-1)


def position_weights(k: int, factor: int, position: int) -> np.ndarray:
    """Weights over the edges of ``factor`` for orderings that add it at ``position`` (1-based).

    Each S of size position - 1 is equally likely: 1 / C(k-1, position-1); other sizes weigh 0.
    """
    sizes = popcount(edges_without(k, factor))
    return np.where(sizes == position - 1, 1.0 / comb(k - 1, position - 1), 0.0)


def position_matrix(k: int, factor: int) -> np.ndarray:
    """[k + 1, 2**k]: ``factor``'s mean gain when added at position 1..k, then over all
    orderings (its Shapley value), as contrast rows of the cell means."""
    sizes = popcount(edges_without(k, factor))
    weights = [position_weights(k, factor, p) for p in range(1, k + 1)] + [shapley_weights(k, sizes)]
    return edge_rows(k, factor, np.stack(weights))


def leave_one_out(values: np.ndarray) -> np.ndarray:
    """v(all) - v(all - i) per factor: [..., 2**k] -> [..., k]."""
    k = int(np.log2(values.shape[-1]))
    full = 2**k - 1
    return np.stack([values[..., full] - values[..., full ^ (1 << i)] for i in range(k)], axis=-1)


def add_one(values: np.ndarray) -> np.ndarray:
    """v({i}) - v(none) per factor: [..., 2**k] -> [..., k]."""
    k = int(np.log2(values.shape[-1]))
    return np.stack([values[..., 1 << i] - values[..., 0] for i in range(k)], axis=-1)
