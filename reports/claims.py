"""The machine-readable verdict: every statistic the summary tests, its family, its adjusted
p-value, and the claims (``claims.csv``) that the "supported by the data" list renders from.

Which families a design gets (see ``multiplicity`` for the adjustment):

- full design, or a regular fraction of resolution V or more: ``attribution`` = Shapley values
  (kind ``shapley``), ``interactions`` = two-factor interaction effects, ``order`` = each
  factor's gain when added last minus when added first;
- a fraction below resolution V: ``attribution`` = main effects (kind ``main``) and
  ``interactions`` = alias chains, each named in full (``a:b = c:d``); no order claims, since
  they would rest on which member of a chain is the real one;
- an incomplete design (a one-at-a-time path, a star of add-one cells, a design with holes):
  ``steps`` = gains between observed cells that differ in one factor, along the requested
  orderings, add-one and leave-one-out. They are path gains, not main effects.

A transfer study adds the families ``transfer`` (Welch's technique x setting test, estimate the
largest between-setting gap with its TOST interval) and ``flips`` (a sign change seen on
simultaneous intervals, estimate the difference between the two settings with the interval
those imply); see ``transfer``.

A claim is a tested statistic with p_adjusted < alpha; its interval is the statistic's own
(marginal) confidence interval, which then excludes zero (for the transfer families: the
intervals named above). ``adjust_tests`` applies the one guarantee the list holds to
(``Guarantee``, worded in ``Guarantee.sentence``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .design import DesignInfo
from .inference import Estimates
from .multiplicity import across_families, adjust_within, bonferroni, sidak
from .orderings import path_masks
from .table import cell_label, factor_label

CLAIM_COLUMNS = ["kind", "term", "estimate", "ci_low", "ci_high", "p_value", "p_adjusted", "family"]
KINDS = ("main", "shapley", "interaction", "order", "step", "transfer")


@dataclass(frozen=True)
class ClaimOptions:
    adjust: str = "holm"  # holm | bh | none, within each family
    alpha: float = 0.05  # 1 - confidence
    per_effect_tests: bool = False  # one run per cell: Lenth's ME per effect instead of the SME


def _rows(kind: str, family: str, terms: list[str], est: Estimates | pd.DataFrame) -> pd.DataFrame:
    if isinstance(est, pd.DataFrame):
        values = est
    else:
        values = pd.DataFrame(
            {"estimate": est.estimate, "ci_low": est.ci_low, "ci_high": est.ci_high, "p_value": est.p_value}
        )
    return pd.DataFrame(
        {
            "kind": kind,
            "term": terms,
            "estimate": values["estimate"].to_numpy(float),
            "ci_low": values["ci_low"].to_numpy(float),
            "ci_high": values["ci_high"].to_numpy(float),
            "p_value": values["p_value"].to_numpy(float),
            "family": family,
        }
    )


def _effect_rows(all_effects: pd.DataFrame, order: int, kind: str, family: str) -> pd.DataFrame:
    chosen = all_effects[all_effects["order"] == order]
    values = chosen.rename(columns={"effect": "estimate"})
    return _rows(kind, family, list(chosen["term"]), values)


def step_edges(design: DesignInfo, paths, factors: list[str], observed: set[int]) -> list[tuple[int, int]]:
    """Observed neighbouring cells (before, after) along the orderings, add-one and leave-one-out."""
    k, full = len(factors), 2 ** len(factors) - 1
    edges = []
    for _, path in paths:
        masks = path_masks(path, factors)
        edges += list(zip(masks[:-1].tolist(), masks[1:].tolist()))
    edges += [(0, 1 << i) for i in range(k)] + [(full ^ (1 << i), full) for i in range(k)]
    return [e for e in dict.fromkeys(edges) if e[0] in observed and e[1] in observed]


def _step_rows(design: DesignInfo, factors, values, paths) -> pd.DataFrame:
    edges = step_edges(design, paths, factors, set(int(m) for m in values.fit.masks))
    if not edges:
        return pd.DataFrame(columns=[*CLAIM_COLUMNS[:-2], "family"])
    contrasts = np.zeros((len(edges), 2**design.k))
    for j, (before, after) in enumerate(edges):
        contrasts[j, after], contrasts[j, before] = 1.0, -1.0
    terms = [f"{cell_label(a, factors)} -> {cell_label(b, factors)}" for a, b in edges]
    est = values.summarize(lambda v: v @ contrasts.T, "steps", terms, "gain")
    return _rows("step", "steps", terms, est)


@dataclass(frozen=True)
class Guarantee:
    """The one error statement the whole claims list holds to (see ``multiplicity``)."""

    adjust: str  # holm | bh | none
    alpha: float
    families: tuple[str, ...]  # the families that have tests, in order
    scope: str = ""  # what the families pool, e.g. "each pooled over the 3 settings"
    simultaneous: tuple[str, ...] = ()  # families held to Lenth's simultaneous margin (one run per cell), not `adjust`
    simultaneous_m: int = 0  # the effects that margin is simultaneous over

    @property
    def n_families(self) -> int:
        return max(len(self.families), 1)

    def sentence(self) -> str:
        """The summary's method line for the claims, in words that match what was computed."""
        names = ", ".join(self.families) or "none"
        scope = f"; {self.scope}" if self.scope else ""
        if self.simultaneous and self.adjust != "none":
            scope += (f"; the {' and '.join(self.simultaneous)} famil{'ies use' if len(self.simultaneous) > 1 else 'y uses'} "
                      f"Lenth's simultaneous margin over the {self.simultaneous_m} effects (Sidak) instead, one run per cell")
        if self.adjust == "none":
            return (
                f"Claims: raw p-values, no adjustment (families: {names}{scope}): each sentence holds at "
                f"{self.alpha:.0%} on its own, and the list as a whole has no error guarantee."
            )
        times = f"then times the {self.n_families} families (Bonferroni)" if self.n_families > 1 else "one family"
        if self.adjust == "bh":
            return (
                f"Claims: Benjamini-Hochberg within each family ({names}{scope}), {times}: the false discovery "
                f"rate of the whole claims list is at most {self.alpha:.0%} (the expected share of false claims "
                f"among the claims, not the chance of none); a claim needs adjusted p < {self.alpha:.2g}."
            )
        return (
            f"Claims: {'Holm' if self.adjust == 'holm' else self.adjust} adjustment within each family ({names}{scope}), "
            f"{times}: the family-wise error rate of the whole claims list is at most {self.alpha:.0%} (the chance "
            f"that any claim in it is false); a claim needs adjusted p < {self.alpha:.2g}."
        )


def _within(rows: pd.DataFrame, options: ClaimOptions, sidak_m: int | None, bonferroni_count: int | None) -> np.ndarray:
    p = rows["p_value"].to_numpy(float)
    if bonferroni_count is not None and options.adjust != "none":
        return bonferroni(p, bonferroni_count)  # simultaneous intervals behind the family (transfer flips)
    simultaneous = sidak_m is not None and rows["family"].iloc[0] in ("attribution", "interactions")
    if simultaneous and rows["kind"].isin(["main", "interaction"]).all():
        return sidak(p, sidak_m)  # Lenth's SME over all m effects
    return adjust_within(p, options.adjust)


def adjust_tests(
    tests: pd.DataFrame, options: ClaimOptions, sidak_m: int | None, bonferroni_counts: dict[str, int] | None = None,
    scope: str = "",
) -> tuple[pd.DataFrame, Guarantee]:  # fmt: skip
    """``tests`` with ``p_adjusted`` (within each family, then Bonferroni over the families that
    have a p-value) and ``claimed`` (p_adjusted < alpha), and the guarantee that holds for them.

    ``sidak_m``: one run per cell, Lenth's simultaneous rule over that many effects for the
    effect families; ``bonferroni_counts``: {family: number of simultaneous intervals}.
    """
    tests = tests.reset_index(drop=True).copy()
    families = tuple(dict.fromkeys(tests.loc[tests["p_value"].notna(), "family"]))
    simultaneous = tuple(
        family for family in families if sidak_m is not None and family in ("attribution", "interactions")
        and not (bonferroni_counts or {}).get(family) and tests.loc[tests["family"] == family, "kind"].isin(["main", "interaction"]).all()
    )  # as `_within` decides
    guarantee = Guarantee(options.adjust, options.alpha, families, scope, simultaneous, sidak_m or 0)
    adjusted = np.full(len(tests), np.nan)
    for family, rows in tests.groupby("family", sort=False):
        within = _within(rows, options, sidak_m, (bonferroni_counts or {}).get(family))
        adjusted[rows.index.to_numpy()] = across_families(within, guarantee.n_families, options.adjust)
    tests["p_adjusted"] = adjusted
    tests["claimed"] = tests["p_adjusted"] < options.alpha
    return tests, guarantee


@dataclass(frozen=True)
class StatisticsToTest:
    """The statistics the claims families test, as the analysis computed them."""

    shapley: pd.DataFrame  # the Shapley table (NaN values where the design does not give them)
    phi: Estimates  # the Shapley values' estimates behind it
    effects: pd.DataFrame  # main effects and two-factor terms with their ``order`` (of the chain's term)
    order_gaps: pd.DataFrame  # gain when added last minus when added first, per factor


def build_tests(design: DesignInfo, factors, values, paths, statistics: StatisticsToTest, options: ClaimOptions, lenth):
    """(every tested statistic with p_adjusted and ``claimed``, effects table with p_adjusted,
    the guarantee). ``values``: the analysis's CellValues (for the step gains of an incomplete
    design, along ``paths``); ``lenth``: Lenth's PSE and margins, one run per cell (else None).
    """
    effects, order_gaps = statistics.effects, statistics.order_gaps
    resolution_v = design.kind == "full" or (design.kind == "fraction" and (design.resolution or 0) >= 5)
    parts = []
    if resolution_v and statistics.shapley["shapley"].notna().all():
        parts.append(_rows("shapley", "attribution", factors, statistics.phi))
    elif design.kind == "fraction":
        parts.append(_effect_rows(effects, 1, "main", "attribution"))
    if design.kind in ("full", "fraction"):
        parts.append(_effect_rows(effects, 2, "interaction", "interactions"))
    if resolution_v and not order_gaps.empty and order_gaps["gap"].notna().all():
        parts.append(_rows("order", "order", factors, order_gaps.rename(columns={"gap": "estimate"})))
    if design.kind == "incomplete":
        parts.append(_step_rows(design, factors, values, paths))
    parts = [p for p in parts if len(p)]
    sidak_m = simultaneous_effects(lenth, options)
    tests = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=CLAIM_COLUMNS[:-2] + ["family"])
    tests, guarantee = adjust_tests(tests, options, sidak_m)
    tests = tests[[*CLAIM_COLUMNS, "claimed"]]
    return tests, effects_with_adjusted(effects, tests, options, sidak_m, guarantee.n_families), guarantee


def simultaneous_effects(lenth: dict | None, options: ClaimOptions) -> int | None:
    """m of Lenth's simultaneous rule, or None when the effect families use their own adjustment."""
    return None if lenth is None or options.per_effect_tests else int(lenth["m"])


def effects_with_adjusted(effects, tests, options, sidak_m, n_families) -> pd.DataFrame:
    """effects.csv's p_adjusted: a row's family value when the summary tests it; other main
    effects (or interactions) are adjusted among themselves the same way."""
    table = effects.copy()
    tested = tests[tests["kind"].isin(["main", "interaction"])].set_index("term")["p_adjusted"]
    table["p_adjusted"] = table["term"].map(tested).astype(float)
    for order, kind, family in ((1, "main", "attribution"), (2, "interaction", "interactions")):
        rows = table["p_adjusted"].isna() & (table["order"] == order) & table["p_value"].notna()
        if rows.any():
            as_family = pd.DataFrame({"family": family, "kind": kind, "p_value": table.loc[rows, "p_value"].to_numpy()})
            within = _within(as_family, options, sidak_m, None)
            table.loc[rows, "p_adjusted"] = across_families(within, n_families, options.adjust)
    return table


def claims_table(tests: pd.DataFrame) -> pd.DataFrame:
    """claims.csv: the claimed rows, in family order."""
    return tests[tests["claimed"]][CLAIM_COLUMNS].reset_index(drop=True)


# ---------------------------------------------------------------- sentences


def short_term(term: str) -> str:
    """``clip_higher:dynamic_sampling = -a:b`` -> ``CH:DS = -a:b`` (DAPO's labels where they apply)."""

    def member(text: str) -> str:
        sign = "-" if text.startswith("-") else ""
        return sign + ":".join(factor_label(f) for f in text.removeprefix("-").split(":"))

    return " = ".join(member(m) for m in term.split(" = "))


def amount(value: float, percent: bool) -> str:
    return f"{100 * value:+.1f} pp" if percent else f"{value:+.4g}"


def interval(low: float, high: float, percent: bool) -> str:
    return f"[{100 * low:.1f}, {100 * high:.1f}]" if percent else f"[{low:.4g}, {high:.4g}]"


def _p(row) -> str:
    return f"p = {row.p_value:.2g}, adjusted {row.p_adjusted:.2g}"


def claim_sentence(row, percent: bool) -> str:
    """The summary's sentence for one claims.csv row (uses nothing but the row)."""
    value, ci = amount(row.estimate, percent), interval(row.ci_low, row.ci_high, percent)
    direction = "helps" if row.estimate > 0 else "hurts"
    term = short_term(row.term)
    if row.kind == "shapley":
        return f"{term} {direction} on average over all orderings: Shapley {value} {ci} ({_p(row)})."
    if row.kind == "main":
        return f"{term} {direction}: main effect {value} {ci} ({_p(row)})."
    if row.kind == "interaction":
        return f"Interaction {term}: {value} {ci}; the factors' gains depend on each other ({_p(row)})."
    if row.kind == "order":
        return (
            f"Order matters for {term}: its gain added last minus added first is {value} {ci} ({_p(row)})."
        )
    if row.kind == "step":
        return f"Path gain {term}: {value} {ci}, at that point of the path only ({_p(row)})."
    if row.kind == "transfer":  # term: "<statistic> <term> (<setting a> - <setting b>)"
        statistic, rest = row.term.split(" ", 1)
        name, pair = rest.rsplit(" (", 1)
        pair = pair.rstrip(")")
        label = {"main": "main effect of", "shapley": "Shapley value of", "interaction": "interaction"}.get(statistic, statistic)
        if row.family == "flips":
            up, down = pair.split(" - ")
            return (
                f"The {label} {short_term(name)} flips sign between settings: above zero in {up}, below zero in {down}, "
                f"each on simultaneous intervals ({_p(row)}); {pair} = {value} {ci}."
            )
        return (
            f"The {label} {short_term(name)} differs between settings (Welch's technique x setting test, {_p(row)}); "
            f"largest gap {pair} = {value} {ci}."
        )
    return f"{row.kind} {term}: {value} {ci} ({_p(row)})."


def unsupported_sentences(tests: pd.DataFrame, percent: bool) -> list[str]:
    """One line per untested or unclaimed attribution or step, one per other family."""
    lines = []
    open_rows = tests[~tests["claimed"]]
    for row in open_rows[open_rows["family"].isin(["attribution", "steps"])].itertuples(index=False):
        what = {"shapley": "Shapley", "main": "main effect", "step": "path gain"}[row.kind]
        text = f"{short_term(row.term)}: {what} {amount(row.estimate, percent)}"
        if np.isnan(row.p_value):
            lines.append(f"{text}: no interval, so no claim either way.")
        else:
            lines.append(
                f"{text} {interval(row.ci_low, row.ci_high, percent)} (unadjusted CI; adjusted p = {row.p_adjusted:.2g}): "
                "not distinguishable from zero after the family's adjustment."
            )
    interactions = open_rows[open_rows["family"] == "interactions"]
    if len(interactions):
        smallest = interactions["p_adjusted"].min()
        lines.append(
            f"{len(interactions)} of {int((tests['family'] == 'interactions').sum())} two-factor interactions are not "
            "distinguishable from zero"
            + (f" (smallest adjusted p = {smallest:.2g})." if np.isfinite(smallest) else " (no intervals).")
        )
    order = open_rows[open_rows["family"] == "order"]
    if len(order):
        lines.append(
            f"No clear order dependence for {', '.join(short_term(t) for t in order['term'])} "
            "(gain added last vs first not distinguishable after adjustment)."
        )
    return lines
