"""A verl cell's result, read back from the MLflow run verl logged into (no second copy).

verl logs validation as ``val-core/<data_source>/acc/mean@k`` (avg@k), ``.../best@k/mean`` (pass@k)
and ``.../maj@k/mean`` (maj@k); its MLflow logger writes ``@`` as ``_at_``. Per-step signals keep
verl's names in MLflow and are mapped back to the trainer's keys for the ledger.
"""

from __future__ import annotations

import re
from typing import Any

_VAL = re.compile(r"val-core/[^/]+/acc/(mean|best|maj)(?:@|_at_)(\d+)(?:/mean)?$")
_SCORE = {"mean": "avg", "best": "pass", "maj": "maj"}
SIGNALS = {
    "critic/score/mean": "reward",
    "actor/entropy": "entropy",
    "response_length/mean": "response_length",
    "response_length/clip_ratio": "truncation_rate",
    "actor/ppo_kl": "approx_kl",
    "actor/pg_clipfrac": "pg_clipfrac",
    "actor/grad_norm": "grad_norm",
    "train/num_gen_batches": "gen_rounds",
}
"""verl metric -> the trainer's signal key in the ledger."""


def score_name(metric: str) -> str | None:
    """``val-core/aime/acc/mean_at_32`` -> ``avg@32``; None for other metrics."""
    match = _VAL.match(metric)
    return f"{_SCORE[match.group(1)]}@{match.group(2)}" if match else None


def result_from_history(history: dict[str, list[tuple[int, float]]], wall_s: float) -> dict[str, Any]:
    """The ledger result from verl's metric histories {name: [(step, value), ...]}."""
    curve: dict[int, dict[str, Any]] = {}
    signals: dict[int, dict[str, Any]] = {}
    for name, points in history.items():
        score = score_name(name)
        for step, value in points:
            if score:
                curve.setdefault(step, {"step": step})[score] = value
            elif name in SIGNALS:
                signals.setdefault(step, {"step": step})[SIGNALS[name]] = value
    eval_curve = [curve[s] for s in sorted(curve)]
    final = {k: v for k, v in (eval_curve[-1] if eval_curve else {}).items() if k != "step"}
    steps = max((s for points in history.values() for s, _ in points), default=0)
    return {"metrics": {**final, "steps": steps}, "eval_curve": eval_curve,
            "signals": [signals[s] for s in sorted(signals)], "wall_s": float(wall_s)}


def result_from_mlflow(tracking_uri: str, run_id: str, wall_s: float | None = None) -> dict[str, Any]:
    """Read verl's metrics of MLflow run `run_id` into the ledger's result shape. `wall_s`: the
    job's own duration (`ablation.jobs`); without it, the run's start to its last metric."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    histories = {name: client.get_metric_history(run_id, name) for name in run.data.metrics}
    history = {name: [(m.step, m.value) for m in points] for name, points in histories.items()}
    if wall_s is None:
        last = max((m.timestamp for points in histories.values() for m in points), default=run.info.start_time)
        wall_s = (last - run.info.start_time) / 1000.0
    return result_from_history(history, wall_s)
