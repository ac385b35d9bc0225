"""The results contract: the names every layer shares, defined once.

The trainer (core), the scheduler and its stores (ablation, sweeps), the reports and the CLI all
speak of the same things: DAPO's five techniques and their labels, the metric names (``avg@32``,
``pass@32``, ``maj@32``), the columns of the results table, and the keys of one run's result.
They are defined here and imported everywhere else. This module uses the standard library only
and imports nothing of dapo_ablate, so any layer may import it (it sits below them all).

- ``TECHNIQUES``, ``TECHNIQUE_LABELS``, ``SHORT_LABELS``: the techniques in the paper's cumulative
  order, their names in the paper and their short labels (``OF+CH`` cell labels).
- ``DEFAULT_METRIC``, ``METRIC_KINDS``, ``METRIC_PATTERN``, ``parse_metric``, ``metric_name``.
- ``SEED_COLUMN``, ``SETTING_COLUMN``, ``COMPUTE_COLUMNS``: columns of the results table.
- ``RESULT_KEYS`` and ``RunRecord``: one run's result, as a cell function returns it, the ledger
  stores it and the results table is built from it.
- ``FactorInfo``: a factor's name and the values of its two levels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# --- the techniques -------------------------------------------------------------------------------
TECHNIQUES = ("overlong_filter", "clip_higher", "soft_overlong", "token_level_loss", "dynamic_sampling")
"""The five DAPO techniques (Yu et al., 2025, arXiv 2503.14476), in the order of the paper's
cumulative table: each row there adds one technique to the row above."""

TECHNIQUE_LABELS = {
    "overlong_filter": "Overlong Filtering",
    "clip_higher": "Clip-Higher",
    "soft_overlong": "Soft Overlong Punishment",
    "token_level_loss": "Token-Level Loss",
    "dynamic_sampling": "Dynamic Sampling",
}
"""Each technique's name in the paper."""

SHORT_LABELS = {
    "overlong_filter": "OF",
    "clip_higher": "CH",
    "soft_overlong": "SP",
    "token_level_loss": "TL",
    "dynamic_sampling": "DS",
}
"""Each technique's short label, as cell labels (``OF+CH``) and specs (``factors: [OF, CH]``) use it."""

# --- design size ---------------------------------------------------------------------------------
MAX_FACTORS = 12
"""Most factors a report analyses: 2^12 = 4,096 cells. Every further factor doubles the cells,
and the report's tables grow with them (the effects table alone has 2^k - 1 rows); a spec is
held to the same bound."""

# --- metric names ---------------------------------------------------------------------------------
DEFAULT_METRIC = "avg@32"
"""The headline metric when none is named: the paper's AIME 2024 number, mean accuracy over 32 samples."""

METRIC_KINDS = ("avg", "pass", "maj")
"""avg@k: mean correctness of k samples; pass@k: unbiased chance one of k is correct; maj@k:
accuracy of the majority answer of k (see core/metrics.py). All are fractions in [0, 1]."""

METRIC_PATTERN = re.compile(r"^(avg|pass|maj)@(\d+)$")
"""An evaluation metric's name: group 1 the kind, group 2 k."""


def metric_text(value: Any, metric: str) -> str:
    """A metric value as a console line shows it: "avg@32 54.3 pp" for an accuracy (stored as a
    fraction), 4 significant digits otherwise; "no metric" for a missing value."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "no metric"
    if METRIC_PATTERN.match(metric):  # avg@k, pass@k, maj@k: fractions, shown in pp
        return f"{metric} {100 * float(value):.1f} pp"
    return f"{metric} {float(value):.4g}"


METRIC_PREFIXES = tuple(f"{kind}@" for kind in METRIC_KINDS)
"""``avg@``, ``pass@``, ``maj@``: how the results table's headline metric columns begin."""


@dataclass(frozen=True)
class MetricName:
    """A parsed evaluation metric name: ``avg@32`` is MetricName("avg", 32)."""

    kind: str
    k: int

    def __str__(self) -> str:
        return metric_name(self.kind, self.k)


def parse_metric(name: str) -> MetricName | None:
    """``avg@32`` -> MetricName("avg", 32); None for anything that is not avg@k, pass@k or maj@k."""
    match = METRIC_PATTERN.match(name) if isinstance(name, str) else None
    return MetricName(match.group(1), int(match.group(2))) if match else None


def metric_name(kind: str, k: int) -> str:
    """The column name of a metric: metric_name("pass", 32) == "pass@32"."""
    if kind not in METRIC_KINDS:
        raise ValueError(f"unknown metric kind {kind!r}; use one of {', '.join(METRIC_KINDS)}")
    return f"{kind}@{k}"


# --- the results table ----------------------------------------------------------------------------
SEED_COLUMN = "seed"
"""The results table's seed column (seeds are blocks: a seed fixes data order and initialisation)."""

SETTING_COLUMN = "setting"
"""A transfer study's column naming each run's setting."""

COMPUTE_COLUMNS = ("tokens_generated", "tokens_discarded", "wall_s")
"""Compute per run: generated tokens (dynamic sampling's discarded ones included), the tokens it
discarded, and wall seconds of the rollout steps and their evaluations."""

# --- one run's result -----------------------------------------------------------------------------
RESULT_KEYS = ("metrics", "eval_curve", "signals", *COMPUTE_COLUMNS)
"""The keys of a run's result dict (what a cell function returns and the ledger stores)."""

_IDENTITY_KEYS = ("run_id", "factors", "seed", "setting")


@dataclass(frozen=True)
class RunRecord:
    """One finished run's result, typed, from the task that trained it to the report.

    The result fields are ``RESULT_KEYS``: metrics, the final evaluation (``avg@32`` ...) plus
    compute totals; eval_curve, one dict per evaluation (``step`` and the metrics); signals, one
    dict per training step; and the compute columns. The identity fields are set once the run is
    known to the scheduler: run_id, factors (factor name -> level), seed and (a transfer study)
    setting. Frozen: fields cannot be reassigned, and `from_dict` / `to_dict` copy the
    containers, so a record never shares a dict with its caller.
    """

    metrics: Mapping[str, Any]
    eval_curve: tuple[Mapping[str, Any], ...] = ()
    signals: tuple[Mapping[str, Any], ...] = ()
    tokens_generated: int = 0
    tokens_discarded: int = 0
    wall_s: float = 0.0
    run_id: str | None = None
    factors: Mapping[str, Any] | None = None
    seed: int | None = None
    setting: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        """A record of a result dict (``RESULT_KEYS``, optionally run_id, factors, seed, setting).

        ``metrics`` is required; the other result keys default to empty / 0, as a cell function
        may leave them out. ValueError names an unknown key or a missing ``metrics``.
        """
        unknown = set(data) - set(RESULT_KEYS) - set(_IDENTITY_KEYS)
        if unknown:
            raise ValueError(
                f"unknown result keys {sorted(unknown)}; a run record has {', '.join(RESULT_KEYS + _IDENTITY_KEYS)}"
            )
        if not isinstance(data.get("metrics"), Mapping):
            raise ValueError("a run result needs `metrics`, a dict of metric name -> value")
        factors = data.get("factors")
        return cls(
            metrics=dict(data["metrics"]),
            eval_curve=tuple(dict(point) for point in data.get("eval_curve") or ()),
            signals=tuple(dict(row) for row in data.get("signals") or ()),
            tokens_generated=int(data.get("tokens_generated", 0)),
            tokens_discarded=int(data.get("tokens_discarded", 0)),
            wall_s=float(data.get("wall_s", 0.0)),
            run_id=data.get("run_id"),
            factors=None if factors is None else dict(factors),
            seed=data.get("seed"),
            setting=data.get("setting"),
        )

    def result_dict(self) -> dict[str, Any]:
        """The result dict: exactly ``RESULT_KEYS``, containers as fresh dicts and lists."""
        return {
            "metrics": dict(self.metrics),
            "eval_curve": [dict(point) for point in self.eval_curve],
            "signals": [dict(row) for row in self.signals],
            "tokens_generated": self.tokens_generated,
            "tokens_discarded": self.tokens_discarded,
            "wall_s": self.wall_s,
        }

    def to_dict(self) -> dict[str, Any]:
        """The result dict plus the identity fields that are set (None ones are left out), so
        ``RunRecord.from_dict(d).to_dict() == d`` for a result dict with every result key."""
        identity = {key: getattr(self, key) for key in _IDENTITY_KEYS if getattr(self, key) is not None}
        if "factors" in identity:
            identity["factors"] = dict(identity["factors"])
        return {**self.result_dict(), **identity}


# --- factors --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FactorInfo:
    """A factor and the values of its two levels: coded 0 (low) and 1 (high) in the results table.

    A technique is off / on (``FactorInfo("clip_higher", False, True)``); a knob has its two
    values (``FactorInfo("eps_high", 0.2, 0.28)``), so a report can say what "on" meant.
    """

    name: str
    low: Any = False
    high: Any = True

    @classmethod
    def technique(cls, name: str) -> FactorInfo:
        """A technique's factor: off (False) and on (True). ValueError for a name not in TECHNIQUES."""
        if name not in TECHNIQUES:
            raise ValueError(f"{name!r} is not a DAPO technique; use one of {', '.join(TECHNIQUES)}")
        return cls(name, False, True)

    @property
    def is_technique(self) -> bool:
        return self.name in TECHNIQUES

    @property
    def label(self) -> str:
        """The short label: OF, CH, SP, TL, DS for the techniques, the name otherwise."""
        return SHORT_LABELS.get(self.name, self.name)

    def level(self, coded: int) -> Any:
        """The value of coded level 0 (low) or 1 (high)."""
        if coded not in (0, 1):
            raise ValueError(f"factor {self.name} has coded levels 0 and 1, not {coded!r}")
        return self.high if coded else self.low

    def describe(self) -> str:
        """``eps_high 0.2 / 0.28``, ``CH off / on``: the factor and what each level means."""
        if self.is_technique and (self.low, self.high) == (False, True):
            return f"{self.label} off / on"
        return f"{self.name} {self.low} / {self.high}"


# --- settings -------------------------------------------------------------------------------------
SETTING_ATTRIBUTES = ("model_family", "model_size", "model_type", "task", "max_response_len")
"""What a setting is, as a transfer study records it and the reports group and compare by."""

MODEL_TYPES = ("base", "instruct", "distilled")
"""A model's type: a pretrained base, an instruction-tuned (aligned) model, or one distilled from a
reasoning model (e.g. DeepSeek-R1-Distill-Qwen-1.5B)."""


@dataclass(frozen=True)
class SettingInfo:
    """One setting and what it is: its model's family (``qwen2.5``), size (``32B``) and type (one
    of MODEL_TYPES), the task (``dapo-math-17k``, a built-in task's name) and the response-length
    ceiling in tokens. None: not known."""

    name: str
    model_family: str | None = None
    model_size: str | None = None
    model_type: str | None = None
    task: str | None = None
    max_response_len: int | None = None

    def attributes(self) -> dict[str, Any]:
        """The attributes by name (SETTING_ATTRIBUTES), None where not known."""
        return {name: getattr(self, name) for name in SETTING_ATTRIBUTES}

    def describe(self) -> str:
        """``qwen2.5 32B base, task dapo-math-17k, ceiling 20480 tokens``: the known attributes."""
        model = " ".join(str(v) for v in (self.model_family, self.model_size, self.model_type) if v)
        parts = [model] if model else []
        parts += [f"task {self.task}"] if self.task else []
        parts += [f"ceiling {self.max_response_len} tokens"] if self.max_response_len else []
        return ", ".join(parts) or "attributes not recorded"
