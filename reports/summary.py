"""A short plain-language summary of what the data do and do not support."""

from __future__ import annotations

import numpy as np

from .analysis import Analysis
from .table import factor_label


def _amount(value: float, percent: bool) -> str:
    return f"{100 * value:+.1f} pp" if percent else f"{value:+.4g}"


def _interval(low: float, high: float, percent: bool) -> str:
    return f"[{100 * low:.1f}, {100 * high:.1f}]" if percent else f"[{low:.4g}, {high:.4g}]"


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
        "fraction": f"regular 2^({k}-{k - int(np.log2(len(design.observed)))}) fraction, resolution {design.resolution}",
        "incomplete": f"incomplete design ({len(design.observed)} of {2**k} cells)",
    }[design.kind]
    return f"Design: {kind}, {seed_text}, {analysis.n_runs} runs; metric {analysis.metric}."


def _attribution_lines(analysis: Analysis) -> tuple[list[str], list[str]]:
    supported, unsupported = [], []
    table, percent = analysis.shapley, analysis.percent
    if table["shapley"].isna().all():
        return supported, unsupported
    source = "" if analysis.design.kind == "full" else " (from the fitted model)"
    for row in table.itertuples(index=False):
        name = factor_label(row.factor)
        text = f"{name}: Shapley {_amount(row.shapley, percent)} {_interval(row.ci_low, row.ci_high, percent)}{source}"
        if np.isnan(row.ci_low):
            unsupported.append(f"{text}: no interval, so no claim either way.")
        elif row.ci_low > 0:
            supported.append(f"{text}: helps on average over orderings.")
        elif row.ci_high < 0:
            supported.append(f"{text}: hurts on average over orderings.")
        else:
            unsupported.append(f"{text}: not distinguishable from zero with these seeds.")
    return supported, unsupported


def _interaction_lines(analysis: Analysis) -> list[str]:
    effects = analysis.effects
    pairs = effects[effects["term"].str.contains(":") & (effects["p_value"] < 1 - analysis.confidence)]
    return [
        f"Interaction {':'.join(factor_label(f) for f in row.term.split(':'))}: "
        f"{_amount(row.effect, analysis.percent)} (p = {row.p_value:.2g}); the factors' gains depend on each other."
        for row in pairs.itertuples(index=False)
    ]


def _order_lines(analysis: Analysis) -> tuple[list[str], list[str]]:
    """Order dependence judged by the CI of (gain when added last - gain when added first)."""
    supported, unsupported = [], []
    gaps, percent = analysis.order_gaps, analysis.percent
    if gaps.empty or gaps["gap"].isna().all():
        return supported, unsupported
    overall = analysis.orderings[analysis.orderings["position"] == "all"].set_index("factor")
    flat = []
    for row in gaps.itertuples(index=False):
        if np.isnan(row.ci_low) or row.ci_low <= 0 <= row.ci_high:
            flat.append(factor_label(row.factor))
            continue
        share = (
            f"; it helps in {100 * overall.loc[row.factor, 'share_positive']:.0f}% of orderings"
            if row.factor in overall.index
            else ""
        )
        supported.append(
            f"Order matters for {factor_label(row.factor)}: added first it gains {_amount(row.first, percent)}, "
            f"added last {_amount(row.last, percent)} (difference {_amount(row.gap, percent)} "
            f"{_interval(row.ci_low, row.ci_high, percent)}){share}."
        )
    if flat:
        unsupported.append(
            f"No clear order dependence for {', '.join(flat)} (first vs last gain not distinguishable)."
        )
    return supported, unsupported


def _path_line(analysis: Analysis) -> list[str]:
    """The first ordering's step gains beside the Shapley values: what a single path misattributes."""
    table = analysis.cumulative
    if table.empty or analysis.shapley["shapley"].isna().all():
        return []
    name = table["ordering"].iloc[0]
    steps = table[(table["ordering"] == name) & (table["step"] > 0)]
    if steps["delta"].isna().any():
        return []
    shapley = analysis.shapley.set_index("factor")["shapley"]
    along = ", ".join(
        f"{factor_label(r.added)} {_amount(r.delta, analysis.percent)}" for r in steps.itertuples(index=False)
    )
    average = ", ".join(
        f"{factor_label(r.added)} {_amount(shapley[r.added], analysis.percent)}"
        for r in steps.itertuples(index=False)
    )
    return [
        f"Along the {name} ordering the step gains are {along}; averaged over all orderings (Shapley) they are {average}."
    ]


def summary_sections(analysis: Analysis) -> dict[str, list[str]]:
    """{"Design": [...], "Supported by the data": [...], "Not supported by the data": [...], "Method": [...]}."""
    supported, unsupported = _attribution_lines(analysis)
    order_supported, order_unsupported = _order_lines(analysis)
    supported += _interaction_lines(analysis) + order_supported + _path_line(analysis)
    unsupported += order_unsupported
    check = analysis.shapley_check
    if check is not None:
        supported.append(
            f"Shapley values sum to {_amount(check['sum'], analysis.percent)} = full "
            f"({_amount(check['full'], analysis.percent)[1:]}) minus baseline ({_amount(check['baseline'], analysis.percent)[1:]}): "
            + ("check passed." if check["ok"] else "CHECK FAILED.")
        )
    if analysis.design.kind == "fraction":
        unsupported.append("Aliased terms cannot be told apart: " + "; ".join(analysis.aliases[:6]) + ".")
    if "Lenth" in analysis.effects_method:
        unsupported.append(
            "With one seed per cell, the noise level is inferred from the small effects (Lenth); run more seeds for intervals that do not assume most effects are zero."
        )
    unsupported += analysis.notes
    unsupported.append(
        "Everything here holds for this model, data, budget and metric; other settings may differ."
    )
    return {
        "Design": [design_line(analysis)],
        "Supported by the data": supported or ["No factor or interaction is distinguishable from zero."],
        "Not supported by the data": unsupported,
        "Method": [
            f"Intervals ({analysis.confidence:.0%}): {analysis.ci_method}.",
            f"Factorial effects: {analysis.effects_method}.",
            f"Shapley values, orderings and leave-one-out use {analysis.values_source}.",
        ]
        + (
            [
                "The effects table pools the residual variance of all runs; the bootstrap intervals use only seed-to-seed "
                "variation of each statistic, so with few seeds they are wider and may call fewer terms clear."
            ]
            if "bootstrap over seeds" in analysis.ci_method and "residual df" in analysis.effects_method
            else []
        ),
    }
