"""What a report says beyond its own claims, for a single experiment and a transfer study alike:
the settings it ran in (settings.csv), what it predicts for another experiment
(predictions.yaml), whether it confirms the predictions it was given (confirmation.csv,
prediction_ranks.csv) and how it stands beside published effects (published.csv).

Each verdict is computed once, here (``Evidence``); the pages, the console summary and the CSVs
render that one object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dapo_ablate.core.contracts import SETTING_ATTRIBUTES, SETTING_COLUMN, SettingInfo

from .analysis import Analysis
from .confirm_looks import look_verdict_lines, look_verdicts
from .export import write_csv
from .options import ReportOptions
from .predictions import (
    CONFIRMATION_COLUMNS, Confirmation, Prediction, confirm_predictions, confirmation_lines, load_predictions,
    predictions_data, write_predictions,
)  # fmt: skip
from .published import published_comparison, published_lines

SETTINGS_HEADING, CONFIRM_HEADING, PUBLISHED_HEADING = "What the settings are", "Predictions confirmed", "Published effects"
THIS_EXPERIMENT = "this experiment"
"""The setting name of an experiment without settings when nothing names it (a results CSV)."""


@dataclass
class Evidence:
    """The settings, the predictions written, the confirmation of those given and the published
    comparison of one report."""

    settings: pd.DataFrame  # setting + SETTING_ATTRIBUTES
    predictions: dict
    published: pd.DataFrame  # published.PUBLISHED_COLUMNS
    confirmation: Confirmation | None = None
    sections: dict[str, list[str]] = field(default_factory=dict)  # heading -> lines, for every summary


def read_predictions(options: ReportOptions) -> list[Prediction] | None:
    """The predictions to confirm, read before anything is written (ReportInputError: one sentence)."""
    return None if options.predictions is None else load_predictions(options.predictions, options.metric)


def single_setting(options: ReportOptions) -> str:
    """The name a single experiment's one setting goes by: the spec's, else THIS_EXPERIMENT."""
    return options.settings[0].name if len(options.settings) == 1 else THIS_EXPERIMENT


def setting_infos(options: ReportOptions, names: list[str]) -> dict[str, SettingInfo]:
    """Each setting's attributes (``options.settings``) by name; one the options do not describe:
    its name only."""
    known = {info.name: info for info in options.settings}
    return {name: known.get(name) or SettingInfo(name) for name in names}


def settings_table(infos: dict[str, SettingInfo]) -> pd.DataFrame:
    """settings.csv: one row per setting with its attributes (empty where not known)."""
    rows = [{SETTING_COLUMN: info.name, **info.attributes()} for info in infos.values()]
    return pd.DataFrame(rows, columns=[SETTING_COLUMN, *SETTING_ATTRIBUTES])


def gather_evidence(
    analyses: dict[str, Analysis], runs: dict[str, pd.DataFrame], options: ReportOptions,
    predictions: list[Prediction] | None,
) -> Evidence:
    """The report's evidence for ``analyses`` (by setting; a single experiment: ``single_setting``)."""
    shown = setting_infos(options, list(analyses))
    percent = all(a.percent for a in analyses.values())
    published = published_comparison(analyses, shown, options.equivalence_margin)
    evidence = Evidence(settings_table(shown), predictions_data(analyses, shown, options.predict_for), published)
    evidence.sections[SETTINGS_HEADING] = [f"{name}: {info.describe()} (settings.csv)" for name, info in shown.items()]
    watched = look_verdicts(options.looks)
    if watched is not None:  # an adaptive design in confirm mode: its looks decide the verdicts
        evidence.confirmation, lines = looks_confirmation(watched, analyses, shown, runs, options, predictions)
        evidence.sections[CONFIRM_HEADING] = lines
    elif predictions is not None:
        evidence.confirmation = confirm_predictions(predictions, analyses, shown, runs, options.equivalence_margin)
        evidence.sections[CONFIRM_HEADING] = evidence.confirmation.lines()
    evidence.sections[PUBLISHED_HEADING] = published_lines(published, shown, percent)
    return evidence


def looks_confirmation(
    watched: list[dict], analyses: dict[str, Analysis], shown: dict[str, SettingInfo], runs: dict[str, pd.DataFrame],
    options: ReportOptions, predictions: list[Prediction] | None,
) -> tuple[Confirmation, list[str]]:
    """Confirm mode: confirmation.csv holds the watched predictions' verdicts from the looks (the
    decision's own lines, ``decision.adaptive_decision``); the rank agreement of the file's
    predictions, when given, is computed as for any report (a description, not a verdict)."""
    percent = all(a.percent for a in analyses.values())
    table = pd.DataFrame(watched, columns=CONFIRMATION_COLUMNS)
    lines = look_verdict_lines(watched, percent, options.looks_alpha)
    ranks = pd.DataFrame()
    if predictions is not None:
        ranks = confirm_predictions(predictions, analyses, shown, runs, options.equivalence_margin).ranks
    confirmation = Confirmation(table, ranks, percent, 1 - next(iter(analyses.values())).confidence)
    rank_lines = confirmation_lines(Confirmation(table.iloc[:0], ranks, percent, confirmation.alpha))[:-1] if len(ranks) else []
    return confirmation, lines + rank_lines


def write_evidence(evidence: Evidence, out: Path) -> dict[str, Path]:
    """predictions.yaml, settings.csv and published.csv always; confirmation.csv and
    prediction_ranks.csv when predictions were given."""
    written = {"predictions.yaml": write_predictions(out / "predictions.yaml", evidence.predictions),
               "settings.csv": out / "settings.csv"}  # fmt: skip
    write_csv(evidence.settings, written["settings.csv"])
    frames = {"published.csv": evidence.published}
    if evidence.confirmation is not None:
        frames |= {"confirmation.csv": evidence.confirmation.table, "prediction_ranks.csv": evidence.confirmation.ranks}
    for name, frame in frames.items():
        written[name] = out / name
        write_csv(frame, written[name])
    return written
