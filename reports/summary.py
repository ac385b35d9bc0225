"""A short plain-language summary of what the data do and do not support.

"Supported by the data" is rendered from the claims table (``claims.csv``), one sentence per
row, so the sentences and the table cannot disagree. Everything else is either a statistic
that did not pass its family's adjusted test ("Not supported by the data"), a description
with no test behind it ("Described"), or how the numbers were made ("Method").
"""

from __future__ import annotations

import numpy as np

from .analysis import Analysis
from .claims import amount, unsupported_sentences
from .decision import ADAPTIVE, Decision, decision_of
from .design import defining_relation, roman
from .headline import headline, headline_lines
from .table import factor_label

EMPTY_SUPPORTED = "None: no statistic passes its family's adjusted test."
EMPTY_LOOKS = "None: no term has crossed its group-sequential boundary at any look."


def empty_supported(analysis: Analysis) -> str:
    """What an empty "Supported by the data" says, by the rule that decided it."""
    return EMPTY_LOOKS if decision_of(analysis).rule == ADAPTIVE else EMPTY_SUPPORTED


def design_line(analysis: Analysis) -> str:
    design, k = analysis.design, len(analysis.factors)
    seeds = sorted(set(analysis.cells["n"]))
    seed_text = (
        f"{seeds[0]} seed{'s' if seeds[0] > 1 else ''} per cell"
        if len(seeds) == 1
        else f"{seeds[0]}-{seeds[-1]} seeds per cell"
    )
    kind = {
        "full": f"full 2^{k} factorial",
        "fraction": f"regular 2^({k}-{k - int(np.log2(len(design.observed)))}) fraction, resolution {roman(design.resolution)}",
        "incomplete": f"incomplete design ({len(design.observed)} of {2**k} cells)",
    }[design.kind]
    return f"Design: {kind}, {seed_text}, {analysis.n_runs} runs; metric {analysis.metric}."


def _design_lines(analysis: Analysis) -> list[str]:
    lines = [design_line(analysis)]
    design = analysis.design
    if design.kind == "fraction":
        defining = defining_relation(design, analysis.factors)
        if (design.resolution or 0) < 5:
            lines.append(
                f"WARNING: resolution {roman(design.resolution)} is below V: two-factor interactions cannot be told apart "
                f"from their aliases, and no claim names one member of a chain alone. Defining relation {defining}. "
                "Every two-factor alias chain (a minus sign: the chain's effect is the first term minus that one):"
            )
        else:
            lines.append(f"Defining relation {defining}; the alias chains of main effects and two-factor interactions:")
        lines += [f"  {chain}" for chain in analysis.aliases]
    if analysis.levels:
        lines.append("Levels (0 / 1): " + "; ".join(info.describe() for info in analysis.levels) + ".")
    return lines


def _described(analysis: Analysis) -> list[str]:
    """The first ordering's step gains beside the Shapley values, and the Shapley sum check."""
    lines, percent = [], analysis.percent
    table = analysis.cumulative
    shapley = analysis.shapley.set_index("factor")["shapley"]
    if not table.empty and not shapley.isna().all():
        name = table["ordering"].iloc[0]
        steps = table[(table["ordering"] == name) & (table["step"] > 0)]
        if not steps["delta"].isna().any():
            along = ", ".join(f"{factor_label(r.added)} {amount(r.delta, percent)}" for r in steps.itertuples(index=False))
            average = ", ".join(
                f"{factor_label(r.added)} {amount(shapley[r.added], percent)}" for r in steps.itertuples(index=False)
            )
            lines.append(
                f"Along the {name} ordering the step gains are {along}; averaged over all orderings (Shapley) "
                f"they are {average}. A step gain holds at that point of the path only."
            )
    check = analysis.shapley_check
    if check is not None:
        lines.append(
            f"Shapley values sum to {amount(check['sum'], percent)} = full ({amount(check['full'], percent)[1:]}) "
            f"minus baseline ({amount(check['baseline'], percent)[1:]}): "
            + ("check passed." if check["ok"] else "CHECK FAILED.")
        )
    return lines


def _lenth_line(analysis: Analysis) -> list[str]:
    """The one-seed rule as applied: the bar printed is the bar the claims used (``lenth_rule``)."""
    lenth = analysis.lenth
    if lenth is None:
        return []
    show = lambda value: amount(value, analysis.percent)[1:]  # noqa: E731
    options, guarantee = analysis.options, analysis.guarantee
    share = options.alpha / (1 if options.adjust == "none" else guarantee.n_families)
    if not options.per_effect_tests:
        rule = (
            f"an effect is claimed only past {show(lenth['bar'])}: Lenth's simultaneous margin over the "
            + (f"{lenth['m']} effects" if lenth["over"] == lenth["m"] else f"{lenth['over']} effects of all the settings")
            + f" at level {share:.2g}"
            + (f" (the {options.alpha:.0%} split over {guarantee.n_families} families)" if share < options.alpha else "")
            + f"; the SME at {options.alpha:.0%} alone would be {show(lenth['sme'])}"
        )
    elif lenth["bar"] == lenth["bar_last"]:
        rule = f"each effect is tested on its own (--per-effect-tests): claimed past {show(lenth['bar'])}"
    else:
        rule = (
            f"effects are tested one by one (--per-effect-tests), then adjusted within their family at level "
            f"{share:.2g}: the first claim needs {show(lenth['bar'])}, the last {show(lenth['bar_last'])}"
        )
    return [
        f"With one seed per cell the noise level is inferred from the small effects (Lenth, PSE {show(lenth['pse'])}): "
        f"margin of error ME = {show(lenth['me'])} per effect, unadjusted; {rule}. "
        "Run more seeds for intervals that do not assume most effects are zero."
    ]


def _method_lines(analysis: Analysis, decision: Decision) -> list[str]:
    adjustment = decision.guarantee
    methods = set(analysis.intervals["se_method"])
    return [
        f"Intervals ({analysis.confidence:.0%}): {analysis.ci_method}.",
        f"Factorial effects: {analysis.effects_method}.",
        f"Shapley values, orderings and leave-one-out use {analysis.values_source}.",
        "Not linear in the cell means, so shown without intervals (no bootstrap is used): the min, max and share of "
        "orderings in which a factor helps, tokens_vs_baseline and gain_per_added_mtok.",
        adjustment,
    ] + (["Standard errors by statistic: " + ", ".join(sorted(methods)) + " (intervals.csv)."] if len(methods) > 1 else [])


def summary_sections(analysis: Analysis) -> dict[str, list[str]]:
    """{("What produced it",) "Headline", ("Looks",) "Design", "Supported by the data", "Not supported by
    the data", "Described", "Method"}: lists of lines. What produced the results opens it (when
    known: `ReportOptions.provenance`), then the headline: full vs baseline with its interval, and
    the best cells; an adaptive design's looks come next, since they are its decision.

    "Supported by the data" has exactly one sentence per row of claims.csv, the experiment's one
    decision (`decision.decision_of`: an adaptive design's looks, else the adjusted tests); none
    when it is empty (renderers then print EMPTY_SUPPORTED, not as a list item).
    """
    decision = decision_of(analysis)
    if decision.rule == ADAPTIVE:
        unsupported = [*decision.not_supported,
                       "The effects, Shapley values and orderings in the tables below are fixed-design statistics of the "
                       "same runs: they ignore that the design looked at its data on the way, so they describe, they do "
                       "not decide."]
    else:
        unsupported = unsupported_sentences(analysis.tests, analysis.percent) + _lenth_line(analysis)
    if analysis.design.kind == "fraction" and analysis.aliases:
        unsupported.append("Aliased terms cannot be told apart: see the alias chains under Design.")
    unsupported += analysis.notes
    unsupported.append("Everything here holds for this model, data, budget and metric; other settings may differ.")
    looks = {"Looks": analysis.look_lines} if analysis.look_lines else {}
    provenance = {"What produced it": list(analysis.provenance)} if analysis.provenance else {}
    return {
        **provenance,
        "Headline": headline_lines(headline(analysis)),
        **looks,
        "Design": _design_lines(analysis),
        "Supported by the data": decision.sentences(),
        "Not supported by the data": unsupported,
        "Described": _described(analysis) or ["Nothing further."],
        **analysis.evidence,
        "Method": _method_lines(analysis, decision),
    }
