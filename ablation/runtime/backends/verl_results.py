"""A verl cell's result, read back from the MLflow run verl logged into (no second copy).

What verl 0.9.1 logs (``verl.trainer.ppo.ray_trainer._val_metrics_update``, ``metric_utils``):

- validation, at step 0 (``val_before_train``) and every ``test_freq`` steps, as
  ``val-core/<data_source>/acc/mean@k`` (avg@k), ``.../best@k/mean`` (pass@k) and ``.../maj@k/mean``
  (maj@k), k the largest ``val_kwargs.n``; its MLflow logger writes ``@`` as ``_at_``. verl's best@k
  and maj@k are bootstrap means over resamples of the k responses (drawn with replacement), so they
  sit a little below the exact pass@k / maj@k the built-in trainer computes; avg@k is exact.
- training signals once per step (1-based) under the names `metric_names.STEP_NAMES` gives the
  built-in trainer's signals (``critic/score/mean`` for reward, ...); they come back under the
  trainer's keys, plus ``pg_clipfrac`` (verl's ``actor/pg_clipfrac``, the lower and upper clip
  fractions together, which the built-in trainer logs apart).
- ``timing_s/testing`` at the steps that evaluate: the eval curve's ``time_eval_s``.

Strict: a result is recorded only when the MLflow run holds every training step of the schedule
and an evaluation at the last one, with every score the earlier evaluations had (verl validates at
the last step whenever ``test_freq > 0``, which ``backends.verl`` always sets). A lost final
validation write is a failed run (`IncompleteRun`), never an earlier step's value recorded as the
cell's result. ``<data_source>`` may contain ``/`` (verl's own ``openai/gsm8k``).

Compute columns: ``steps`` (the last training step) and ``wall_s`` (the durations of the run's jobs,
every attempt's added up: ``jobs.attempts_wall_s``). verl logs
no token totals, so they are rebuilt from its per-step means: ``tokens_generated`` is, per step,
``response_length/mean`` times the responses trained on (``prompts_per_step x group_size``) plus
the responses of the groups Dynamic Sampling dropped (``training/filter_groups/evicted_samples``
and ``.../discarded_surplus_samples``, counted in groups, times ``group_size``) at the same mean
length; those dropped tokens are ``tokens_discarded``. Both are estimates (verl does not log the
dropped groups' lengths); the built-in trainer counts them exactly.
"""

from __future__ import annotations

import re
from typing import Any

from dapo_ablate.ablation.runtime.joblog import log_tail
from dapo_ablate.ablation.store.metric_names import EVAL_TIME_NAME, STEP_NAMES, mlflow_safe

_VAL = re.compile(r"val-core/(?P<source>.+)/acc/(?P<score>mean|best|maj)(?:@|_at_)(?P<k>\d+)(?:/mean)?$")
_SCORE = {"mean": "avg", "best": "pass", "maj": "maj"}
SIGNALS = {**{mlflow_safe(verl): ours for ours, verl in STEP_NAMES.items()}, "actor/pg_clipfrac": "pg_clipfrac"}
"""verl's training metric -> the trainer's signal key in the ledger."""
RESPONSE_LENGTH = "response_length/mean"
DROPPED_GROUPS = ("training/filter_groups/evicted_samples", "training/filter_groups/discarded_surplus_samples")
"""Groups (prompts) Dynamic Sampling dropped in a step, as verl's v1 trainer counts them."""


class IncompleteRun(RuntimeError):
    """verl's MLflow run lacks training steps of the schedule or the final evaluation; the message
    is one sentence, and the run is recorded failed (retried), never with an earlier step's value."""


def score_name(metric: str) -> str | None:
    """``val-core/aime/acc/mean_at_32`` -> ``avg@32``; None for other metrics."""
    match = _VAL.match(metric)
    return f"{_SCORE[match['score']]}@{match['k']}" if match else None


def eval_sources(history: dict[str, list[tuple[int, float]]]) -> list[str]:
    """The ``<data_source>`` names of verl's val-core metrics in `history`, sorted."""
    return sorted({match["source"] for name in history if (match := _VAL.match(name))})


def result_from_history(
    history: dict[str, list[tuple[int, float]]], wall_s: float,
    responses_per_step: int | None = None, group_size: int | None = None, source: str | None = None,
    total_steps: int | None = None,
) -> dict[str, Any]:
    """The ledger result from verl's metric histories {name: [(step, value), ...]}.

    `source`: the held-out set's verl ``data_source``, needed only when several were validated.
    `responses_per_step` and `group_size` (from the cell's config) give the token totals.
    `total_steps`: the schedule's length; fewer logged steps raise `IncompleteRun`. Raises
    `IncompleteRun` too when the last step has no evaluation or a partial one.
    """
    sources = eval_sources(history)
    if source is None and len(sources) > 1:
        raise ValueError(f"verl validated on several data sources {sources}; say which one is the held-out set")
    curve, signals = _curve_and_signals(history, source)
    eval_curve = [curve[s] for s in sorted(curve)]
    steps = max([*signals, *curve], default=0)
    if total_steps is not None and steps < total_steps:
        raise IncompleteRun(f"verl's job ended after {steps} of {total_steps} training steps "
                            "(or the last steps' metric writes were lost)")
    final = final_evaluation(eval_curve, steps)
    tokens = token_totals(history, responses_per_step, group_size)
    return {"metrics": {**final, "steps": steps}, "eval_curve": eval_curve,
            "signals": [signals[s] for s in sorted(signals)], "wall_s": float(wall_s), **tokens}


def _curve_and_signals(history: dict[str, list[tuple[int, float]]], source: str | None,
                       ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """{step: evaluation} of the held-out set and {step: training signals}, each with its ``step``."""
    curve: dict[int, dict[str, Any]] = {}
    signals: dict[int, dict[str, Any]] = {}
    for name, points in history.items():
        match = _VAL.match(name)
        for step, value in points:
            if match and match["source"] == (source or match["source"]):
                curve.setdefault(step, {"step": step})[score_name(name)] = value
            elif name in SIGNALS:
                signals.setdefault(step, {"step": step})[SIGNALS[name]] = value
    for step, value in history.get(EVAL_TIME_NAME, []):
        if step in curve:
            curve[step]["time_eval_s"] = value
    return curve, signals


def final_evaluation(eval_curve: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The last evaluation's scores, which must be at the last training step `steps` and carry
    every score an earlier evaluation had; else `IncompleteRun` (one sentence)."""
    if not eval_curve or eval_curve[-1]["step"] != steps:
        last = f"the last one is at step {eval_curve[-1]['step']}" if eval_curve else "there is none"
        raise IncompleteRun(f"verl logged no evaluation at the final step {steps} ({last}): its final validation "
                            "write is missing, and an earlier step's value is not the cell's result")
    scores = {key for point in eval_curve for key in point if key not in ("step", "time_eval_s")}
    missing = sorted(scores - set(eval_curve[-1]))
    if missing:
        raise IncompleteRun(f"verl's evaluation at the final step {steps} lacks {', '.join(missing)} "
                            "(its final validation write is partial)")
    return {k: v for k, v in eval_curve[-1].items() if k != "step"}


def token_totals(history: dict[str, list[tuple[int, float]]], responses_per_step: int | None,
                 group_size: int | None) -> dict[str, int]:
    """``tokens_generated`` and ``tokens_discarded`` rebuilt from per-step mean response lengths
    (see the module docstring); empty without the batch sizes or the lengths."""
    lengths = dict(history.get(RESPONSE_LENGTH, []))
    if not responses_per_step or not group_size or not lengths:
        return {}
    dropped: dict[int, float] = {}
    for name in DROPPED_GROUPS:
        for step, groups in history.get(name, []):
            dropped[step] = dropped.get(step, 0.0) + groups * group_size
    trained = sum(length * responses_per_step for length in lengths.values())
    discarded = sum(dropped.get(step, 0.0) * length for step, length in lengths.items())
    return {"tokens_generated": round(trained + discarded), "tokens_discarded": round(discarded)}


def batch_sizes(config: dict[str, Any]) -> tuple[int, int]:
    """(responses trained on per step, group size) of a cell's trainer config."""
    from dapo_ablate.core.config import build_trainer_config

    trainer = build_trainer_config(config)
    return trainer.batch.prompts_per_step * trainer.algorithm.group_size, trainer.algorithm.group_size


def result_from_mlflow(tracking_uri: str, run_id: str, wall_s: float | None = None,
                       config: dict[str, Any] | None = None, job_log: str = "") -> dict[str, Any]:
    """Read verl's metrics of MLflow run `run_id` into the ledger's result shape. `wall_s`: the
    job's own duration (`ablation.jobs`); without it, the run's start to its last metric.
    `config`: the cell's trainer config (its batch sizes give the token totals, and a run that
    logged fewer training steps than its schedule is refused: verl can exit 0 and mark its MLflow
    run FINISHED without having trained to the end). `job_log`: its tail goes into the error."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    histories = {name: client.get_metric_history(run_id, name) for name in run.data.metrics}
    history = {name: [(m.step, m.value) for m in points] for name, points in histories.items()}
    if wall_s is None:
        last = max((m.timestamp for points in histories.values() for m in points), default=run.info.start_time)
        wall_s = (last - run.info.start_time) / 1000.0
    tail = f"; last lines of its log: {log_tail(job_log)}" if job_log else ""
    if not eval_sources(history):  # e.g. verl could not attach to the run and went on without MLflow
        raise RuntimeError(f"verl logged no validation (val-core/<data_source>/acc/mean@k) into MLflow run {run_id}; "
                           f"the job's log says why (look for 'MLflow initialization'){tail}")
    responses, group_size = batch_sizes(config) if config is not None else (None, None)
    total = _total_steps(config) if config is not None else None
    try:
        return result_from_history(history, wall_s, responses, group_size, total_steps=total)
    except IncompleteRun as err:
        raise IncompleteRun(f"{err} (MLflow run {run_id}); not recorded as a finished run{tail}") from None


def _total_steps(config: dict[str, Any]) -> int:
    from dapo_ablate.core.config import build_trainer_config

    return build_trainer_config(config).schedule.total_steps
