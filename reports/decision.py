"""One decision per experiment: what the data support, with which interval, under which error
guarantee, computed once by the rule the design was run for, and rendered by every output
(the report's summary and claims.csv, the console after `run`, `status`, the MLflow parent run's
tags), so that they cannot disagree.

The rule, by design:

- a fixed design (a full factorial, a regular fraction, an incomplete design; with one seed per
  cell the noise comes from Lenth's PSE): the claims families' adjusted tests (``claims``): a claim
  is a tested statistic whose family-adjusted p-value is below alpha;
- an adaptive design: its looks (``sequential``): a term is supported when its statistic crossed
  the group-sequential boundary at a look, with the repeated confidence interval of the last look
  (valid over all looks together). The fixed-design tests of the same runs ignore that the
  experiment looked at its data on the way, so they are not its decision (the report still shows
  them as tables, described);
- a transfer study: every row of its claims.csv, each setting's own claims and the transfer claims,
  under one guarantee (``transfer_report``).

``Decision.sentences`` is the "Supported by the data" list, one sentence per claims row, so the
list and claims.csv are the same thing twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .claims import CLAIM_COLUMNS, amount, claim_sentence, interval, short_term
from .confirm_looks import look_verdict_lines, look_verdicts, number_or_nan

FIXED, ADAPTIVE, TRANSFER = "fixed design", "adaptive looks", "transfer study"
SUPPORTED, NOT_SUPPORTED, UNDECIDED, NOT_WATCHED = "supported", "not supported", "undecided", "not watched"
CLAIMS_TAG = "dapo.claims"
"""The MLflow parent run's tag holding the decision's sentences (" | " between them; "none" when empty)."""
RULE_TAG = "dapo.claims.rule"
CONFIRM_TAG = "dapo.confirm"
"""An adaptive design in confirm mode: its verdict on each watched prediction (" | " between them)."""
COUNT_METRIC = "claims/count"
MAX_TAG = 5000
"""MLflow keeps a tag value of at most this many characters."""


@dataclass(frozen=True)
class Decision:
    """What one experiment's data support (``claims``, CLAIM_COLUMNS, with a leading ``setting``
    column for a transfer study), the rule that decided it and the sentence of its guarantee."""

    rule: str  # FIXED | ADAPTIVE | TRANSFER
    claims: pd.DataFrame
    guarantee: str
    percent: bool
    not_supported: tuple[str, ...] = field(default=())  # the rule's own "not supported" lines (adaptive)
    confirm: tuple[str, ...] = field(default=())  # confirm mode: the verdict on each watched prediction (adaptive)

    def sentences(self) -> list[str]:
        """The "Supported by the data" list: one sentence per claims row (a transfer study's own
        claims prefixed with their setting)."""
        lines = []
        for row in self.claims.itertuples(index=False):
            sentence = claim_sentence(row, self.percent) if self.rule != ADAPTIVE else look_claim_sentence(row, self.percent)
            setting = getattr(row, "setting", None)
            lines.append(f"In {setting}: {sentence}" if setting not in (None, "all") else sentence)
        return lines

    def count_line(self) -> str:
        """``claims.csv: N claims (the adaptive design's looks)``, as the console ends with it."""
        n = len(self.claims)
        if not n:
            return f"claims.csv: header only: nothing is supported by the data ({self.rule})"
        return f"claims.csv: {n} claim{'s' if n > 1 else ''} ({self.rule}; the summary's \"Supported by the data\")"

    def tags(self) -> dict[str, str]:
        """The MLflow parent run's tags of this decision."""
        claims = " | ".join(self.sentences()) or "none"
        cut = lambda text: text if len(text) <= MAX_TAG else text[:MAX_TAG - 3] + "..."  # noqa: E731 - MLflow's tag limit
        tags = {CLAIMS_TAG: cut(claims), RULE_TAG: cut(f"{self.rule}: {self.guarantee}")}
        return tags | ({CONFIRM_TAG: cut(" | ".join(self.confirm))} if self.confirm else {})


def decision_of(analysis: Any) -> Decision:
    """The decision an analysis carries (an adaptive design's, set by the report), else its fixed design's."""
    return analysis.decision if analysis.decision is not None else fixed_decision(analysis)


def fixed_decision(analysis: Any) -> Decision:
    """A fixed design's decision: the analysis's adjusted tests (``analysis.claims``)."""
    return Decision(FIXED, analysis.claims[CLAIM_COLUMNS].reset_index(drop=True), analysis.guarantee.sentence(),
                    analysis.percent)


def adaptive_decision(looks: Sequence[Mapping[str, Any]], alpha: float | None, percent: bool = True) -> Decision | None:
    """An adaptive design's decision: its last look's supported terms (None before any look)."""
    if not looks:
        return None
    last = looks[-1]
    rows = [row for row in last.get("terms", []) if row.get("decision") == SUPPORTED]
    number = last.get("number", last.get("look"))
    family = f"look {number}"
    claims = pd.DataFrame(
        [{"kind": "main" if int(row.get("order") or 1) == 1 else "interaction", "term": str(row.get("term")),
          "estimate": number_or_nan(row.get("estimate")), "ci_low": number_or_nan(row.get("ci_low")), "ci_high": number_or_nan(row.get("ci_high")),
          "p_value": _nominal_p(row.get("z")), "p_adjusted": float("nan"), "family": family} for row in rows],
        columns=CLAIM_COLUMNS,
    )
    others = [row for row in last.get("terms", []) if row.get("decision") not in (SUPPORTED, NOT_WATCHED)]
    not_supported = tuple(
        f"{short_term(str(row.get('term')))}: {amount(number_or_nan(row.get('estimate')), percent)} "
        f"{interval(number_or_nan(row.get('ci_low')), number_or_nan(row.get('ci_high')), percent)} (repeated CI): {row.get('decision')}"
        + (", futility: the interval excludes the effect of interest" if row.get("decision") == NOT_SUPPORTED else "")
        + "."
        for row in others
    )
    level = f"{alpha:g}" if alpha is not None else "alpha"
    guarantee = (f"Claims: the adaptive design's decisions at look {number} ({last.get('runs')} runs): a term is supported "
                 f"when its z crossed the group-sequential boundary at a look; the family-wise error rate over all terms "
                 f"and all looks is at most {level} (alpha spent so far {number_or_nan(last.get('spent')):.4f}); intervals are "
                 "repeated confidence intervals, valid over all looks together.")
    verdicts = look_verdicts(looks)
    if verdicts is not None:
        guarantee += f" Confirm mode: only the {len(verdicts)} predicted terms were watched and decided."
    confirm = tuple(look_verdict_lines(verdicts, percent, alpha)) if verdicts is not None else ()
    return Decision(ADAPTIVE, claims, guarantee, percent, not_supported, confirm)


def look_claim_sentence(row: Any, percent: bool) -> str:
    """The sentence of a claim decided at a look (no adjusted p-value: the boundary decided it)."""
    direction = "helps" if row.estimate > 0 else "hurts"
    what = "main effect" if row.kind == "main" else "interaction"
    return (f"{short_term(row.term)} {direction}: {what} {amount(row.estimate, percent)} "
            f"{interval(row.ci_low, row.ci_high, percent)} (repeated CI; crossed the boundary by {row.family}).")


def _nominal_p(z: Any) -> float:
    """The two-sided nominal p-value of a look's z (for reading, not for deciding)."""
    value = number_or_nan(z)
    return float(2 * stats.norm.sf(abs(value))) if np.isfinite(value) else float("nan")
