"""The MLflow names of a run's signals: verl's names wherever verl has one.

The ledger keeps the trainer's own keys (`dapo_ablate.core.trainer.SIGNALS`, ``avg@32``); only
what is logged to MLflow is renamed here, so reports of old and new experiments read the same
ledger. MLflow refuses ``@`` in a metric name, so it becomes ``_at_`` exactly as verl's own
MLflow logger does (``val-core/aime/acc/mean@32`` is ``val-core/aime/acc/mean_at_32`` in
MLflow). The README's "Metric names" table lists every name with its verl and TRL counterpart.

Each signal is logged once: training signals per rollout step, evaluations per evaluation step
(the final evaluation is the last one, not logged again), compute totals once at the last step.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dapo_ablate.core.contracts import METRIC_PATTERN

STEP_NAMES = {
    "reward": "critic/score/mean",
    "entropy": "actor/entropy",
    "response_length": "response_length/mean",
    "response_length_max": "response_length/max",
    "truncation_rate": "response_length/clip_ratio",
    "approx_kl": "actor/ppo_kl",
    "clipfrac_low": "actor/pg_clipfrac_low",
    "clipfrac_high": "actor/pg_clipfrac_high",
    "grad_norm": "actor/grad_norm",
    "lr": "actor/lr",
    "gen_rounds": "train/num_gen_batches",
    "time_rollout_s": "timing_s/gen",
    "time_reward_s": "timing_s/reward",
    "time_update_s": "timing_s/update_actor",
}
"""Trainer signal -> MLflow name; a signal not listed is ``train/<signal>``."""

PG_CLIPFRAC = "actor/pg_clipfrac"
"""verl's share of tokens where the clipped objective was taken: lower + upper bound (disjoint)."""

_EVAL_SCORE_NAMES = {"avg": "mean@{k}", "pass": "best@{k}/mean", "maj": "maj@{k}/mean"}
EVAL_AUX_NAMES = {
    "response_length": "response_length/mean",
    "truncation_rate": "response_length/clip_ratio",
}
EVAL_TIME_NAME = "timing_s/testing"
PERF_KEYS = ("tokens_generated", "tokens_discarded", "tokens_trained", "eval_tokens", "wall_s", "peak_rss_mb", "steps")
"""Compute totals of a run, logged once as ``perf/<key>``."""


def mlflow_safe(name: str) -> str:
    """``@`` -> ``_at_`` (what verl's MLflow logger does; MLflow refuses ``@``)."""
    return name.replace("@", "_at_")


def eval_source(config: dict[str, Any]) -> str:
    """verl's ``<data_source>`` of the held-out set: ``builtin``, or the eval file's stem."""
    value = str((config.get("data") or {}).get("eval") or "builtin")
    stem = "builtin" if value == "builtin" else Path(value).name.split(".")[0]
    return re.sub(r"[^\w.-]+", "_", stem) or "eval"


def step_name(key: str) -> str:
    """The MLflow name of a training signal."""
    return STEP_NAMES.get(key) or f"train/{mlflow_safe(key)}"


def eval_name(key: str, source: str) -> str:
    """The MLflow name of an evaluation metric: ``avg@32`` -> ``val-core/<source>/acc/mean_at_32``,
    ``pass@32`` -> ``.../acc/best_at_32/mean``, ``maj@32`` -> ``.../acc/maj_at_32/mean``."""
    match = METRIC_PATTERN.fullmatch(key)
    if match:
        return mlflow_safe(f"val-core/{source}/acc/" + _EVAL_SCORE_NAMES[match.group(1)].format(k=match.group(2)))
    if key == "time_eval_s":
        return EVAL_TIME_NAME
    return mlflow_safe(f"val-aux/{source}/" + EVAL_AUX_NAMES.get(key, key))


def is_eval_key(key: str) -> bool:
    """A key an evaluation produces (the final metrics repeat the last evaluation's)."""
    return bool(METRIC_PATTERN.fullmatch(key)) or key in EVAL_AUX_NAMES or key == "time_eval_s"


def final_name(key: str, source: str) -> str:
    """The MLflow name of one of a run's final metrics or compute totals."""
    if is_eval_key(key):
        return eval_name(key, source)
    if key in PERF_KEYS:
        return f"perf/{key}"
    return mlflow_safe(key)


def step_metrics(signals: dict[str, Any]) -> dict[str, Any]:
    """One step's signals under their MLflow names, with verl's ``actor/pg_clipfrac`` added."""
    out = {step_name(key): value for key, value in signals.items() if key != "step"}
    low, high = signals.get("clipfrac_low"), signals.get("clipfrac_high")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        out[PG_CLIPFRAC] = float(low) + float(high)
    return out


def eval_metrics(metrics: dict[str, Any], source: str) -> dict[str, Any]:
    """One evaluation's metrics under their MLflow names."""
    return {eval_name(key, source): value for key, value in metrics.items() if key != "step"}


def headline_name(metric: str, source: str) -> str:
    """The child runs' MLflow name of the spec's metric (``avg@32`` -> the val-core name)."""
    return final_name(metric, source)
