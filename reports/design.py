"""Which cells an experiment has, and what that lets the reports estimate.

A two-level design over k factors is read from the set of observed cells (bitmasks):

- ``full``: all 2^k cells; every statistic is computed from the cell means directly.
- ``fraction``: a regular fraction 2^(k-p) (e.g. the half fraction E = ABCD): every pair of
  -1/+1 contrast columns over the observed cells is either orthogonal or equal up to sign, and
  no main effect is constant. Terms equal up to sign are *aliases* (their effects cannot be
  told apart); Shapley values and orderings come from a fitted model with main effects and
  two-factor interactions, assuming higher-order interactions are zero.
- ``incomplete``: anything else; the reports give what the observed cells support.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from .table import ReportInputError, cell_label, describe_cell

Term = tuple[int, ...]
"""An interaction term as sorted factor indices: (0,) is the main effect of factor 0, (0, 2) a:c."""


def term_name(term: Term, factors: list[str]) -> str:
    """``a`` for a main effect, ``a:b`` for an interaction, ``I`` for the intercept."""
    return ":".join(factors[i] for i in term) if term else "I"


def all_terms(k: int, max_order: int | None = None) -> list[Term]:
    """Every interaction term up to ``max_order`` (default k), by order then lexicographically."""
    top = k if max_order is None else min(k, max_order)
    return [term for order in range(1, top + 1) for term in combinations(range(k), order)]


def contrast_column(masks: np.ndarray, term: Term) -> np.ndarray:
    """-1/+1 column of a term over cells: prod_{i in term} (2 * level_i - 1). Shape [cells]."""
    column = np.ones(len(masks))
    for i in term:
        column *= 2 * ((masks >> i) & 1) - 1
    return column


def term_mask(term: Term) -> int:
    """The bitmask of a term's factors: (0, 2) -> 0b101."""
    return sum(1 << i for i in term)


def _parity(values: np.ndarray) -> np.ndarray:
    """popcount(x) mod 2 for non-negative integers below 2^32, by folding the bits."""
    values = values.copy()
    for shift in (16, 8, 4, 2, 1):
        values ^= values >> shift
    return values & 1


def contrast_columns(masks: np.ndarray, terms: list[Term]) -> np.ndarray:
    """[terms, cells]: row t is ``contrast_column(masks, terms[t])``, all at once: the product of
    the -1/+1 levels is (-1)^(|T| - popcount(T & cell)), so one parity of T & cell per entry
    (4,095 terms x 4,096 cells in a fraction of a second, not one loop per term)."""
    term_masks = np.array([term_mask(t) for t in terms], dtype=np.int64)
    sizes = np.array([len(t) for t in terms], dtype=np.int64)
    odd = _parity(term_masks[:, None] & np.asarray(masks, dtype=np.int64)[None, :]) ^ (sizes[:, None] & 1)
    return 1.0 - 2.0 * odd


@dataclass(frozen=True)
class DesignInfo:
    """The observed design and what it supports."""

    kind: str  # "full" | "fraction" | "incomplete"
    k: int
    observed: tuple[int, ...]  # observed cell masks, sorted
    missing: tuple[int, ...]  # cell masks absent from a full 2^k design
    alias_groups: tuple[tuple[Term, ...], ...] = field(
        default=()
    )  # fraction: each group's first term is fitted
    defining_words: tuple[Term, ...] = field(default=())  # fraction: terms aliased with the intercept
    defining_signs: tuple[int, ...] = field(default=())  # +1 / -1 per defining word: I = +-word
    alias_signs: tuple[tuple[int, ...], ...] = field(default=())  # per group: each member's column = sign x the first's

    @property
    def resolution(self) -> int | None:
        """Length of the shortest defining word (None for a full or incomplete design)."""
        return min(map(len, self.defining_words)) if self.defining_words else None

    def missing_labels(self, factors: list[str], limit: int = 8) -> str:
        labels = [cell_label(mask, factors) for mask in self.missing[:limit]]
        more = f" and {len(self.missing) - limit} more" if len(self.missing) > limit else ""
        return ", ".join(labels) + more


def walsh_sums(masks: np.ndarray, k: int) -> np.ndarray:
    """[2**k]: F[t] = sum over the observed cells of the -1/+1 column of the term with bitmask t,
    by the fast Walsh-Hadamard transform of the cells' indicator (O(k 2^k)). F[0] = m, and the
    Gram matrix of the contrast columns is F[a ^ b] (a term's column times b's is a ^ b's)."""
    values = np.zeros(2**k, dtype=np.int64)
    values[np.asarray(masks, dtype=np.int64)] = 1
    for bit in range(k):  # pairs (x, x + 2^bit) -> (sum, difference): W[t] = sum_x f(x) (-1)^popcount(t & x)
        pairs = values.reshape(-1, 2, 2**bit)
        values = np.concatenate([pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]], axis=1).ravel()
    sizes = np.zeros(2**k, dtype=np.int64)
    for bit in range(k):
        sizes += (np.arange(2**k) >> bit) & 1
    return np.where(sizes % 2 == 1, -values, values)  # column_t = (-1)^|t| (-1)^popcount(t & x)


def _alias_structure(masks: np.ndarray, k: int):
    """(alias groups, their signs, defining words, their signs) of a regular fraction, or None
    when the cells are not one.

    The Gram matrix G = C^T C of all 2^k contrast columns (intercept included) over the m cells
    is G[a, b] = F[a ^ b] (``walsh_sums``): regular iff every F[t] is 0 or +-m (columns orthogonal
    or aliased). The defining words are the t with |F[t]| = m, the alias group of a term a is
    {a ^ w}, and the sign of each alias is the sign of F[w] (the even half of 2^5, an even number
    of factors on, has every column of ABCDE equal to -1: I = -ABCDE, so A = -BCDE). Groups and
    their members are in term order (by order, then lexicographically).
    """
    walsh, m = walsh_sums(masks, k), len(masks)
    if not np.all(np.isin(np.abs(walsh), (0, m))):
        return None
    terms: list[Term] = [(), *all_terms(k)]
    position = np.empty(2**k, dtype=np.int64)
    position[[term_mask(t) for t in terms]] = np.arange(len(terms))
    words = np.flatnonzero(np.abs(walsh) == m)  # the intercept's group: 0 and the defining words
    groups: list[list[Term]] = []
    signs: list[list[int]] = []
    seen = np.zeros(2**k, dtype=bool)
    for term in terms:
        first = term_mask(term)
        if seen[first]:
            continue
        members = (first ^ words)[np.argsort(position[first ^ words])]
        seen[members] = True
        groups.append([terms[position[b]] for b in members])
        signs.append([int(np.sign(walsh[first ^ b])) for b in members])
    defining = [(term, sign) for term, sign in zip(groups[0], signs[0]) if term]
    return groups[1:], signs[1:], [t for t, _ in defining], [s for _, s in defining]


def describe_design(observed_masks: np.ndarray, k: int) -> DesignInfo:
    """Classify the observed cells as a full design, a regular fraction or an incomplete design."""
    observed = tuple(sorted(set(int(m) for m in observed_masks)))
    missing = tuple(sorted(set(range(2**k)) - set(observed)))
    if not missing:
        return DesignInfo("full", k, observed, missing)
    structure = _alias_structure(np.array(observed), k)
    if structure is not None:
        groups, signs, defining, defining_signs = structure
        # each main effect alone in its group as the fitted term, none constant
        mains_estimable = sum(1 for g in groups if sum(len(t) == 1 for t in g) == 1) == k
        if mains_estimable:
            return DesignInfo(
                "fraction", k, observed, missing, tuple(map(tuple, groups)), tuple(defining),
                tuple(defining_signs), tuple(map(tuple, signs)),
            )  # fmt: skip
    return DesignInfo("incomplete", k, observed, missing)


DESIGN_CHOICES = ("any", "full", "fraction-V", "fraction")
"""``--design``: any (what the cells support), full (every cell), fraction-V (full, or a regular
fraction of resolution V or higher), fraction (any regular fraction, or full)."""


def alias_chain(
    group: tuple[Term, ...], factors: list[str], max_order: int | None = 2, signs: tuple[int, ...] | None = None
) -> str:
    """``a:b = -c:d``: the members of an alias group up to ``max_order`` (all when None), joined
    by `` = ``, each with its sign relative to the first (``signs``; none shown when None); the
    group's first term when none is that short."""
    signs = signs or (1,) * len(group)
    shown = [(t, s) for t, s in zip(group, signs) if max_order is None or len(t) <= max_order] or [(group[0], 1)]
    return " = ".join(("-" if s < 0 else "") + term_name(t, factors) for t, s in shown)


def defining_relation(design: DesignInfo, factors: list[str]) -> str:
    """``I = -a:b:c:d:e`` with each word's sign (the even half of 2^5 is I = -ABCDE)."""
    words = [("-" if s < 0 else "") + term_name(w, factors) for w, s in zip(design.defining_words, design.defining_signs)]
    return " = ".join(["I", *words])


def two_factor_chains(design: DesignInfo, factors: list[str]) -> list[str]:
    """Every alias chain of a fraction that holds a main effect or a two-factor interaction
    and more than one term, in full (all members, every order, with signs)."""
    return [
        alias_chain(group, factors, None, signs)
        for group, signs in zip(design.alias_groups, design.alias_signs)
        if len(group) > 1 and min(map(len, group)) <= 2
    ]


def _design_name(declared: str | None) -> str:
    """Map a declared design (CLI or spec) onto DESIGN_CHOICES."""
    name = (declared or "any").strip().lower().replace("_", "-")
    aliases = {
        "any": "any", "full": "full", "fraction-v": "fraction-V", "fractionv": "fraction-V",
        "res-v": "fraction-V", "resv": "fraction-V", "v": "fraction-V", "fraction": "fraction",
        "fractional": "fraction", "half": "fraction", "one-at-a-time": "any", "cumulative": "any", "adaptive": "any",
    }  # fmt: skip
    if name not in aliases:
        raise ReportInputError(
            f"--design {declared!r} is not one of {', '.join(DESIGN_CHOICES)}; "
            "pick the weakest design you are willing to report on"
        )
    return aliases[name]


def require_design(info: DesignInfo, declared: str | None, factors: list[str]) -> str:
    """Enforce a declared design (see DESIGN_CHOICES); returns its canonical name.

    ``full`` needs every cell; ``fraction`` a regular fraction (or the full design);
    ``fraction-V`` additionally refuses fractions below resolution V, whose two-factor
    interactions are aliased with each other or with main effects.
    """
    name = _design_name(declared)
    if name == "full" and info.kind != "full":
        raise ReportInputError(
            f"the full design has no runs for cell {describe_cell(info.missing[0], factors)}"
            + (f" (and {len(info.missing) - 1} more cells)" if len(info.missing) > 1 else "")
            + "; run the missing cells, or drop --design full to report what the cells support"
        )
    if name in ("fraction", "fraction-V") and info.kind == "incomplete":
        raise ReportInputError(
            f"the {len(info.observed)} observed cells are not a regular fraction of the 2^{info.k} design; "
            "run the missing cells of the fraction, or pass --design any to report what the cells support"
        )
    if name == "fraction-V" and info.kind == "fraction" and info.resolution < 5:
        raise ReportInputError(
            f"the observed cells are a resolution {roman(info.resolution)} fraction, so two-factor interactions "
            "are aliased; run the other half of the fraction (or a resolution V fraction), or pass --design fraction"
        )
    return name


def roman(resolution: int | None) -> str:
    return {3: "III", 4: "IV", 5: "V", 6: "VI"}.get(resolution or 0, str(resolution))
