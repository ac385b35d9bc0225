"""ReportOptions: what a report is asked to do, as one frozen object.

``write_report`` hands it to ``write_transfer_report``, both hand it to ``analyze`` /
``analyze_transfer``, and those derive the claims' ``ClaimOptions`` from it. Each function that
takes ``options=`` also takes any field by keyword (``analyze(results, factors, adjust="bh")``):
``report_options`` applies those changes to the given options (default: the defaults below).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dapo_ablate.core.contracts import DEFAULT_METRIC, FactorInfo, SettingInfo

from .claims import ClaimOptions
from .table import ReportInputError

FORMATS = ("csv", "md", "tex", "png", "html")
"""The file formats a report writes by default: tables as csv / md / tex, figures as png, and the
pages report.md (with md) and report.html (self-contained, with html)."""
VECTOR_FORMATS = ("pdf", "svg")
"""Figures as vector files too, for papers, when asked for (`--format ...,pdf`)."""

DEFAULT_MARGIN = 0.02
"""The transfer verdict's equivalence margin: 2 pp of an accuracy stored as a fraction."""


@dataclass(frozen=True)
class ReportOptions:
    """The options of one report; the CLI's ``dapo-ablate report`` flags map one to one."""

    metric: str = DEFAULT_METRIC
    """The metric column to analyse."""
    orderings: str | list[list[str]] = "paper"
    """Orderings of the cumulative tables: ``paper``, ``all``, or explicit lists of factors."""
    formats: str | Iterable[str] = FORMATS
    """Which of FORMATS to write (a name or several)."""
    confidence: float = 0.95
    """Confidence level of every interval; the claims are tested at alpha = 1 - confidence."""
    design: str | None = None
    """The weakest design to accept: any | full | fraction-V | fraction (``design.require_design``)."""
    adjust: str = "holm"
    """Multiplicity adjustment within each claims family: holm | bh | none."""
    per_effect_tests: bool = False
    """With one run per cell, test effects one by one (Lenth's ME) instead of the experiment-wise SME."""
    equivalence_margin: float = DEFAULT_MARGIN
    """Transfer studies: the largest difference between settings a "transfers" verdict allows, in
    the metric's units."""
    levels: tuple[FactorInfo, ...] = ()
    """Each factor's two levels (what 0 and 1 stand for: CH off / on, eps_high 0.2 / 0.28), from
    the experiment's spec; empty for a results CSV, whose columns code them 0/1 only."""
    looks: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)
    """An adaptive experiment's looks as its ledger recorded them (``looks.looks_table``): the report
    writes looks.csv / looks.md and shows them on its pages; empty for any other design."""
    looks_alpha: float | None = None
    """The family-wise alpha the looks spent (the adaptive spec's ``alpha``), for their summary."""
    held_on: tuple[str, ...] = ()
    """Techniques on in every run without being factors (the base trainer config's): the baseline
    is named by them ("baseline (all factors off; SP, TL on throughout)")."""
    settings: tuple[SettingInfo, ...] = ()
    """What each setting is (model family, size, type, task, length ceiling), from the experiment's
    spec; an experiment without settings has one, named after it. Empty for a results CSV."""
    predictions: str | None = None
    """A predictions.yaml another report wrote: this report confirms it term by term
    (``predictions.confirm_predictions``); None: nothing to confirm."""
    predict_for: SettingInfo | None = None
    """The setting this report's predictions.yaml predicts for (its attributes); None: any."""
    provenance: tuple[str, ...] = field(default=(), compare=False)
    """What produced the results (experiment, spec and overrides, trainer, data, stores, versions,
    date), one line each: the report opens with them."""
    echo: Callable[[str], None] | None = field(default=None, compare=False)
    """Receives the plain-language summary, one line per call (e.g. ``print``); None: silent."""

    @property
    def claims(self) -> ClaimOptions:
        """How the claims are tested: the adjustment, alpha = 1 - confidence, per-effect tests."""
        return ClaimOptions(adjust=self.adjust, alpha=1 - self.confidence, per_effect_tests=self.per_effect_tests)

    def chosen_formats(self) -> set[str]:
        """The formats to write, checked together with the confidence level: ReportInputError
        (one sentence) for an unknown format or a confidence outside (0, 1)."""
        chosen = {self.formats} if isinstance(self.formats, str) else set(self.formats)
        unknown = chosen - set(FORMATS) - set(VECTOR_FORMATS)
        if unknown:
            raise ReportInputError(f"unknown format {', '.join(sorted(unknown))}; choose from "
                                   f"{','.join(FORMATS + VECTOR_FORMATS)}")
        if not 0 < self.confidence < 1:
            raise ReportInputError(f"confidence {self.confidence} is not between 0 and 1; use e.g. 0.95")
        return chosen


def report_options(options: ReportOptions | None, changes: dict[str, Any]) -> ReportOptions:
    """``options`` (default: ReportOptions()) with the fields named in ``changes`` replaced;
    TypeError for a name that is not a field."""
    options = ReportOptions() if options is None else options
    return replace(options, **changes) if changes else options
