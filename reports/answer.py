"""An experiment's answer: its headline (full vs baseline, per setting for a transfer study) and its
one decision (``decision``), computed by the same analysis the report makes, for the outputs that
show it without writing a report: the console after `run`, `status`, and the MLflow parent run.

``log_answer`` replaces the parent run's answer as one unit: every headline metric is logged for
every setting, NaN where this computation has no value, and every tag is set, so no value of an
earlier computation can stay beside this one's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dapo_ablate.core.contracts import SETTING_COLUMN

from .analysis import analyze
from .decision import COUNT_METRIC, Decision, adaptive_decision, fixed_decision
from .headline import Headline, headline, headline_lines, headline_record
from .options import ReportOptions


@dataclass(frozen=True)
class Answer:
    """Headlines by setting ("" without settings) and the decision."""

    headlines: dict[str, Headline]
    decision: Decision

    def lines(self) -> list[str]:
        """What the console prints: each headline's sentence, then what the data support."""
        lines = [f"{name + ': ' if name else ''}{headline_lines(h)[0]}" for name, h in self.headlines.items()]
        sentences = self.decision.sentences()
        lines.append(f"Supported by the data ({self.decision.rule}): " + ("" if sentences else "none."))
        lines += [f"  - {sentence}" for sentence in sentences]
        if self.decision.confirm:
            lines.append("Predictions confirmed (confirm mode):")
            lines += [f"  - {sentence}" for sentence in self.decision.confirm]
        return lines


def experiment_answer(results: pd.DataFrame, factors: list[str], options: ReportOptions,
                      looks: Sequence[Mapping[str, Any]] = (), looks_alpha: float | None = None) -> Answer:
    """The answer of ``results`` under ``options``, as the report computes it: a transfer study's
    (two or more settings), an adaptive design's (``looks``: its looks decide), or a fixed design's.
    Raises ReportInputError like ``analyze`` when the results cannot be analysed."""
    if SETTING_COLUMN in results.columns and results[SETTING_COLUMN].astype(str).nunique(dropna=False) > 1:
        from .transfer import analyze_transfer
        from .transfer_report import transfer_decision

        transfer = analyze_transfer(results, factors, options=options)
        return Answer({name: headline(transfer.analyses[name]) for name in transfer.settings}, transfer_decision(transfer))
    table = results.drop(columns=SETTING_COLUMN) if SETTING_COLUMN in results.columns else results
    analysis = analyze(table, factors, options=options)
    decision = adaptive_decision(looks, looks_alpha, analysis.percent) if looks else fixed_decision(analysis)
    return Answer({"": headline(analysis)}, decision)


def log_answer(tracker: Any, parent_id: str, answer: Answer) -> None:
    """Put the answer on the MLflow parent run ``parent_id`` as one unit (module docstring).
    ``tracker``: anything with ``log_parent_metrics(parent_id, metrics)`` and an MLflow ``client``."""
    metrics, tags = headline_record(answer.headlines)
    metrics[COUNT_METRIC] = float(len(answer.decision.claims))
    tags |= dict(answer.decision.tags())
    tracker.log_parent_metrics(parent_id, metrics)
    for key, value in tags.items():
        tracker.client.set_tag(parent_id, key, value)
