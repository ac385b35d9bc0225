"""``write_transfer_report``: a results table with a ``setting`` column -> every single-setting
table with a ``setting`` column (one CSV each), ``transfer.csv``, ``rank_agreement.csv``, the
forest plot ``transfer.png``, and report.md / report.html whose transfer sentences render from
the ``transfer`` rows of claims.csv."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Callable

import markupsafe
import numpy as np
import pandas as pd

from dapo_ablate.core.contracts import SETTING_COLUMN

from . import plots
from .claims import CLAIM_COLUMNS, amount, interval, short_term
from .decision import TRANSFER, Decision
from .evidence import gather_evidence, write_evidence
from .export import TableFiles, display_frame, to_html, to_markdown, write_csv, write_table
from .headline import headline, headline_lines
from .pages import TABLES, FigureView, cumulative_display, render_page, table_captions
from .summary import EMPTY_SUPPORTED, design_line, summary_sections
from .options import ReportOptions
from .predictions import Prediction
from .transfer import TransferAnalysis, analyze_transfer

STATISTIC_LABELS = {"main": "main effect", "shapley": "Shapley value", "interaction": "interaction"}
PAGE_COLUMNS = [
    "statistic", "term", "setting", "verdict", "detectable_difference", "estimate", "ci_low", "ci_high", "sim_ci_low",
    "sim_ci_high", "p_adjusted", "p_flip_adjusted", "i2", "excluded_beyond",
]  # fmt: skip


def _stacked(transfer: TransferAnalysis, table_of: Callable) -> pd.DataFrame:
    """One table with a leading ``setting`` column, the settings' blocks in order."""
    parts = []
    for name in transfer.settings:
        table = table_of(transfer.analyses[name]).copy()
        table.insert(0, SETTING_COLUMN, name)
        parts.append(table)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def claims_frame(transfer: TransferAnalysis) -> pd.DataFrame:
    """claims.csv: each setting's own claims (setting = its name), then the transfer claims
    (setting = ``all``), all adjusted together under the report's one guarantee."""
    own = _stacked(transfer, lambda a: a.claims[CLAIM_COLUMNS])
    across = transfer.claims.copy()
    across.insert(0, SETTING_COLUMN, "all")
    return pd.concat([own, across], ignore_index=True)[[SETTING_COLUMN, *CLAIM_COLUMNS]]


def transfer_decision(transfer: TransferAnalysis) -> Decision:
    """The study's one decision: every row of claims.csv (each setting's own claims, then the
    transfer claims), under the report's one guarantee."""
    return Decision(TRANSFER, claims_frame(transfer), transfer.guarantee.sentence(), transfer.percent)


def _attribution(transfer: TransferAnalysis) -> str:
    """The statistic the verdict lines lead with: Shapley where every setting has it."""
    shapley = transfer.transfer[transfer.transfer["statistic"] == "shapley"]
    return "shapley" if len(shapley) and shapley["estimate"].notna().all() else "main"


def _verdict_lines(transfer: TransferAnalysis) -> list[str]:
    """What the study could detect first, then one line per term: its verdict, its value in every
    setting, the tests, its detectable difference and (no difference claimed) how far the data
    exclude one."""
    percent, lines = transfer.percent, [_detectable_line(transfer)]
    table = transfer.transfer
    for statistic in dict.fromkeys([_attribution(transfer), "interaction"]):
        for term, rows in table[table["statistic"] == statistic].groupby("term", sort=False):
            each = "; ".join(
                f"{r.setting} {amount(r.estimate, percent)} {interval(r.ci_low, r.ci_high, percent)}"
                for r in rows.itertuples(index=False)
            )
            head = rows.iloc[0]
            precision = (
                f"; differences beyond {amount(head.excluded_beyond, percent)[1:]} not excluded"
                if head.verdict in ("transfers", "inconclusive")
                else ""
            )
            tests = (
                f"Welch p = {head.p_interaction:.2g}, adjusted {head.p_adjusted:.2g}; detectable difference "
                f"{amount(head.detectable_difference, percent)[1:]}{precision}; I^2 = {100 * head.i2:.0f}%"
                if np.isfinite(head.p_adjusted)
                else "no test"
            )
            lines.append(f"{short_term(term)} ({STATISTIC_LABELS[statistic]}): {head.verdict}. {each} ({tests}).")
    return lines


def _detectable_line(transfer: TransferAnalysis) -> str:
    """The transfer answer's first line: the difference between settings this study could detect."""
    table = transfer.transfer.drop_duplicates(["statistic", "term"])
    parts = []
    for statistic in ("shapley", "main", "interaction"):
        found = table.loc[table["statistic"] == statistic, "detectable_difference"].dropna()
        if len(found):
            low, high = (amount(v, transfer.percent)[1:] for v in (found.min(), found.max()))
            label = STATISTIC_LABELS[statistic]
            parts.append(f"{low if low == high else f'{low} to {high}'} in {'an' if label[0] in 'aeiou' else 'a'} {label}")
    if not parts:
        return "Detectable difference: none (no term has an SE in every setting)."
    return (
        f"Detectable difference: as run, this study finds a difference between two settings of "
        f"{', '.join(parts)} with {transfer.detectable_power:.0%} power (the least precise pair that far apart, the "
        "others between them; the report's own tests and adjustment; detectable_difference in transfer.csv). A "
        "smaller difference was likely to be missed, so an inconclusive term says little about it."
    )


def _rank_lines(transfer: TransferAnalysis) -> list[str]:
    lines = []
    for r in transfer.ranks.itertuples(index=False):
        if np.isnan(r.kendall_tau):
            lines.append(f"Rank agreement {r.setting_a} vs {r.setting_b}: no Shapley values in both, not computed.")
        else:
            lines.append(
                f"Rank agreement of the {r.n_factors} techniques' Shapley values, {r.setting_a} vs {r.setting_b}: "
                f"Kendall's tau {r.kendall_tau:+.2f} (p = {r.p_value:.2g}, unadjusted; with {r.n_factors} techniques "
                "only a large tau can be told from chance)."
            )
    return lines


def _not_supported(transfer: TransferAnalysis) -> list[str]:
    table = transfer.transfer.drop_duplicates(["statistic", "term"])
    margin = amount(transfer.margin, transfer.percent)[1:]
    lines = []
    unsure = table[table["verdict"] == "inconclusive"]
    if len(unsure):
        lines.append(
            f"{len(unsure)} of {len(table)} terms are inconclusive: no difference between settings was detected, but "
            f"the data cannot exclude one of {margin} or more (excluded_beyond in transfer.csv), so they are not "
            "said to transfer."
        )
    same = table[table["verdict"] == "transfers"]
    if len(same):
        lines.append(
            f"{len(same)} of {len(table)} terms transfer: every pair of settings is within {margin} by two one-sided "
            f"tests at {transfer.options.alpha:.0%} each (per term; not rows of claims.csv)."
        )
    unknown = table[table["verdict"] == "not enough data"]
    if len(unknown):
        names = ", ".join(f"{STATISTIC_LABELS[r.statistic]} {short_term(r.term)}" for r in unknown.itertuples(index=False))
        lines.append(f"Not enough data to judge transfer for (a setting lacks the value or its noise estimate): {names}.")
    lines.append(
        "A difference between settings is attributed to the settings as wholes: when two settings differ in more "
        "than one override, this design cannot tell which override causes it."
    )
    return lines


def _noise_line(transfer: TransferAnalysis) -> str:
    """Where each setting's noise comes from (never pooled over settings)."""
    parts = []
    for name in transfer.settings:
        analysis = transfer.analyses[name]
        lenth = analysis.lenth
        if lenth is not None:
            parts.append(f"{name}: Lenth's PSE of its own {lenth['m']} effects ({lenth['d']:.1f} df)")
        elif analysis.fit.df > 0:
            parts.append(f"{name}: its cells' own residual variances ({analysis.fit.df:.0f} residual df)")
        else:
            parts.append(f"{name}: no noise estimate (its terms get 'not enough data')")
    return "Each setting's values and intervals are its own analysis's, with its own noise, never pooled: " + "; ".join(parts) + "."


def _method_lines(transfer: TransferAnalysis) -> list[str]:
    options = transfer.options
    n_terms = transfer.transfer.drop_duplicates(["statistic", "term"]).shape[0]
    margin = amount(transfer.margin, transfer.percent)[1:]
    return [
        _noise_line(transfer),
        f"Technique x setting: Welch's heterogeneity test on the settings' own estimates, SEs and df (family transfer, "
        f"{n_terms} terms); Cochran's Q and I^2 describe the spread, with no test behind them.",
        f"Verdicts: flips sign = on simultaneous intervals (each at level 1 - {transfer.simultaneous_alpha:.2g}: every "
        "term in every setting at once, sim_ci_low/sim_ci_high) one setting's value is above zero and another's below; "
        "differs in size = Welch's test holds after adjustment; transfers = every pair of settings within "
        f"{margin} (--equivalence-margin) by two one-sided tests at {options.alpha:.0%} (the widest pair's "
        f"{1 - 2 * transfer.equivalence_alpha:.0%} interval, excluded_beyond, inside the margin); inconclusive = none "
        "of these: no difference detected and none as large as the margin excluded; not enough data = a setting "
        "lacks the value or its noise estimate.",
        f"detectable_difference: the smallest difference between two settings this report claims with "
        f"{transfer.detectable_power:.0%} power, given each setting's SE and df of the term as estimated here, these "
        "tests and this adjustment, with the least precise pair that far apart and the others between them (simulated "
        "reports, as `plan-seeds --seeds` computes it before a study).",
        transfer.guarantee.sentence()
        + " This covers every row of claims.csv: each setting's claims and the transfer claims together.",
    ]


def transfer_sections(transfer: TransferAnalysis) -> dict[str, list[str]]:
    """The transfer summary: each setting's headline (full vs baseline), settings, supported claims
    (one per row of claims.csv: each setting's own, then the transfer claims), not supported,
    verdicts and rank agreement (described), method; what produced it first, when known."""
    provenance = transfer.analyses[transfer.settings[0]].provenance
    return {
        **({"What produced it": list(provenance)} if provenance else {}),
        "Headline": [f"{name}: {headline_lines(headline(transfer.analyses[name]))[0]}" for name in transfer.settings],
        "Settings": [f"{name}: {design_line(transfer.analyses[name])}" for name in transfer.settings],
        "Supported by the data": transfer_decision(transfer).sentences(),
        "Not supported by the data": _not_supported(transfer),
        "Transfer verdicts": _verdict_lines(transfer),
        "Rank agreement": _rank_lines(transfer),
        **transfer.evidence,
        "Method": _method_lines(transfer),
    }


def _pages_context(transfer: TransferAnalysis, html_page: bool) -> dict:
    """What report.md and report.html show: the transfer summary, the transfer and rank tables
    (rendered as Markdown or HTML), and each setting's own summary."""
    tables = []
    shown_transfer = transfer.transfer[PAGE_COLUMNS]  # transfer.csv has every column
    for title, table in (("Transfer table", shown_transfer), ("Rank agreement", transfer.ranks)):
        shown = display_frame(table, transfer.percent, [])
        tables.append((title, markupsafe.Markup(to_html(table, shown)) if html_page else to_markdown(table, shown).rstrip("\n")))
    return {
        "metric": transfer.metric,
        "summary": list(transfer_sections(transfer).items()),
        "tables": tables,
        "settings": [(name, [(heading, lines) for heading, lines in summary_sections(transfer.analyses[name]).items()
                             if heading != "What produced it"]) for name in transfer.settings],
    }


def _figure_caption(transfer: TransferAnalysis) -> str:
    """What transfer.png shows."""
    statistic = STATISTIC_LABELS[_attribution(transfer)]
    confidence = transfer.analyses[transfer.settings[0]].confidence
    return (
        f"Forest plot: each term's {statistic} in every setting (one marker per setting) with its {confidence:.0%} CI, "
        "and the transfer verdict under the term."
    )


def _markdown(transfer: TransferAnalysis, figure: bool) -> str:
    shown = FigureView("transfer.png", _figure_caption(transfer)) if figure else None
    return render_page("transfer.md.j2", figure=shown, **_pages_context(transfer, html_page=False))


def _html(transfer: TransferAnalysis, png: bytes | None) -> str:
    figure = None if png is None else FigureView("transfer.png", _figure_caption(transfer), base64.b64encode(png).decode("ascii"))
    return render_page(
        "transfer.html.j2", title=f"Transfer report: {transfer.metric}", figure=figure,
        **_pages_context(transfer, html_page=True),
    )  # fmt: skip


def write_transfer_report(
    results: pd.DataFrame, factors: list[str], out: Path, options: ReportOptions, predictions: list[Prediction] | None = None
) -> dict[str, Path]:
    """Analyse every setting and the transfer between them; write the files (see module docstring)
    in ``options.formats``, and echo the summary to ``options.echo``. Raises ReportInputError
    (naming the setting) before writing anything. ``predictions``: read from ``options.predictions``
    (``evidence.read_predictions``), to confirm in every setting."""
    chosen = options.chosen_formats()
    transfer = analyze_transfer(results, factors, options=options)
    first = transfer.analyses[transfer.settings[0]]
    runs = {name: rows.drop(columns=SETTING_COLUMN) for name, rows in results.groupby(results[SETTING_COLUMN].astype(str))}
    evidence = gather_evidence(transfer.analyses, runs, options, predictions)
    transfer.evidence = evidence.sections
    out.mkdir(parents=True, exist_ok=True)
    written = write_evidence(evidence, out)
    written |= {"claims.csv": out / "claims.csv", "transfer.csv": out / "transfer.csv",
                "rank_agreement.csv": out / "rank_agreement.csv"}  # fmt: skip
    write_csv(claims_frame(transfer), written["claims.csv"])
    write_csv(transfer.transfer, written["transfer.csv"])
    write_csv(transfer.ranks, written["rank_agreement.csv"])
    captions = table_captions(first)
    files = TableFiles(out, frozenset(chosen), transfer.percent, tuple(factors))
    for name in TABLES:
        table = _stacked(transfer, lambda a: getattr(a, name))
        display = _stacked(transfer, cumulative_display) if name == "cumulative" else None
        caption = captions[name] + " One block of rows per setting (column setting)."
        written |= write_table(name, table, files, caption, display)
    if "csv" in chosen:
        written["intervals.csv"] = out / "intervals.csv"
        write_csv(_stacked(transfer, lambda a: a.intervals), written["intervals.csv"])
    png = None
    if chosen & {"png", "html"}:
        png = plots.forest_plot(transfer.transfer, _attribution(transfer), transfer.metric, transfer.percent, options.confidence)
    if "png" in chosen and png is not None:
        written["transfer.png"] = out / "transfer.png"
        written["transfer.png"].write_bytes(png)
    if "md" in chosen:
        written["report.md"] = out / "report.md"
        written["report.md"].write_text(_markdown(transfer, "transfer.png" in written))
    if "html" in chosen:
        written["report.html"] = out / "report.html"
        written["report.html"].write_text(_html(transfer, png))
    if options.echo is not None:
        for heading, lines in transfer_sections(transfer).items():
            options.echo(f"{heading}:")
            for line in lines or [EMPTY_SUPPORTED]:
                options.echo(f"  - {line}")
    return written
