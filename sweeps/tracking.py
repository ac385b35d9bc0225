"""MLflow logging of a sweep: the study is a parent run, each finished trial a nested child run,
each of the trial's finished runs a child of the trial (`ablation.tracking.Tracker.log_child`).

A trial child (tag ``dapo.role = trial``, ``dapo.trial = <number>``) holds the sampled knobs as
params, the trial's intermediate values as ``eval/<metric>`` per step, its value as ``<metric>``
(``avg_at_32``), in robustness mode ``effect/<factor>`` with ``effect/<factor>/ci_low|ci_high``,
and its Optuna state (tag ``dapo.state``; MLflow status FINISHED, KILLED for pruned, FAILED).
The best trial carries tag ``best_trial = true`` (the others ``false``).

The parent carries the best trial as tags ``best.<knob>``, ``best.trial`` and ``best.value``,
metric ``best_<metric>`` (one point per update) and artifact ``best_params.json``. They are tags,
not params, because MLflow params are write-once and the best trial changes as the study grows.

Idempotence, as for factorial children: a trial child gets tag ``dapo.logged = true`` only after
everything was logged; `logged_trials` deletes half-logged ones so they are logged again.
"""

from __future__ import annotations

import json
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from dapo_ablate.ablation.experiment.design import PlannedRun
from dapo_ablate.ablation.store.tracking import PARENT_TAG, ROLE_TAG, ChildRun, Tracker, metric_name

TRIAL_ROLE = "trial"
TRIAL_TAG = "dapo.trial"
LOGGED_TAG = "dapo.logged"
BEST_TAG = "best_trial"
MLFLOW_STATUS = {TrialState.COMPLETE: "FINISHED", TrialState.PRUNED: "KILLED", TrialState.FAIL: "FAILED"}
_PAGE = 1000


class SweepTracker:
    """The sweep's MLflow parent run and its trial children."""

    def __init__(self, tracker: Tracker, parent_id: str, sweep_name: str, metric: str) -> None:
        self.tracker, self.client, self.parent_id = tracker, tracker.client, parent_id
        self.sweep_name, self.metric = sweep_name, metric

    # -- trials ---------------------------------------------------------------------------------

    def logged_trials(self) -> dict[int, str]:
        """Trial number -> MLflow run id of the fully logged trial children; half-logged
        children (a driver died while logging them) are deleted, so they are logged again."""
        logged: dict[int, str] = {}
        for run in self._trial_children():
            if run.data.tags.get(LOGGED_TAG) == "true":
                logged[int(run.data.tags[TRIAL_TAG])] = run.info.run_id
            else:
                self.client.delete_run(run.info.run_id)
        return logged

    def log_trial(self, trial: FrozenTrial, runs: list[tuple[PlannedRun, dict[str, Any]]]) -> str:
        """Log a finished trial and its finished runs (planned run, ledger result); its run id."""
        from mlflow.entities import Metric, Param

        end_ms = int((trial.datetime_complete or trial.datetime_start).timestamp() * 1000)
        start_ms = int(trial.datetime_start.timestamp() * 1000) if trial.datetime_start else end_ms
        tags = {PARENT_TAG: self.parent_id, ROLE_TAG: TRIAL_ROLE, TRIAL_TAG: str(trial.number),
                "dapo.state": trial.state.name, "dapo.experiment": self.sweep_name, BEST_TAG: "false"}
        if "error" in trial.user_attrs:
            tags["dapo.error"] = str(trial.user_attrs["error"])[:5000]
        child = self.client.create_run(self.tracker.experiment_id, start_time=start_ms, tags=tags,
                                       run_name=f"trial {trial.number}")
        child_id = child.info.run_id
        params = [Param(name, json.dumps(value) if not isinstance(value, str) else value) for name, value in trial.params.items()]
        params.append(Param("trial", str(trial.number)))
        name = metric_name(self.metric)
        metrics = [Metric(f"eval/{name}", float(value), end_ms, int(step))
                   for step, value in sorted(trial.intermediate_values.items())]
        if trial.state == TrialState.COMPLETE and trial.value is not None:
            last = max(trial.intermediate_values, default=0)
            metrics.append(Metric(name, float(trial.value), end_ms, int(last)))
        for factor, effect in (trial.user_attrs.get("effects") or {}).items():
            for key, suffix in (("mean", ""), ("ci_low", "/ci_low"), ("ci_high", "/ci_high")):
                if effect.get(key) is not None:
                    metrics.append(Metric(f"effect/{factor}{suffix}", float(effect[key]), end_ms, 0))
        self.client.log_batch(child_id, metrics=metrics, params=params)
        for planned, result in runs:
            tags = {"dapo.trial": str(trial.number), "dapo.cell": planned.cell.key, "dapo.experiment": self.sweep_name}
            self.tracker.log_child(child_id, ChildRun(planned.run_id, planned.name, dict(planned.factors), planned.seed,
                                                      planned.config.to_dict(), result, tags))
        self.client.set_tag(child_id, LOGGED_TAG, "true")
        self.client.set_terminated(child_id, status=MLFLOW_STATUS.get(trial.state, "FAILED"), end_time=end_ms)
        return child_id

    # -- best -----------------------------------------------------------------------------------

    def mark_best(self, best: FrozenTrial | None, logged: dict[int, str], n_finished: int) -> None:
        """Tag the best trial's child (and only it) ``best_trial = true``; the parent gets the
        best params as tags, the best value as a metric and best_params.json."""
        if best is None:
            return
        from mlflow.entities import Metric, RunTag

        for run in self._trial_children(f" and tags.`{BEST_TAG}` = 'true'"):
            if run.data.tags.get(TRIAL_TAG) != str(best.number):
                self.client.set_tag(run.info.run_id, BEST_TAG, "false")
        if best.number in logged:
            self.client.set_tag(logged[best.number], BEST_TAG, "true")
        tags = [RunTag(f"best.{name}", str(value)) for name, value in best.params.items()]
        tags += [RunTag("best.trial", str(best.number)), RunTag("best.value", repr(best.value))]
        metric = Metric(f"best_{metric_name(self.metric)}", float(best.value), int(best.datetime_complete.timestamp() * 1000), n_finished)
        self.client.log_batch(self.parent_id, metrics=[metric], tags=tags)
        self.tracker.log_dict(self.parent_id, {"trial": best.number, "value": best.value, "params": best.params},
                              "best_params.json")

    def _trial_children(self, extra: str = "") -> list[Any]:
        runs: list[Any] = []
        token = None
        query = f"tags.`{PARENT_TAG}` = '{self.parent_id}' and tags.`{ROLE_TAG}` = '{TRIAL_ROLE}'{extra}"
        while True:
            page = self.client.search_runs([self.tracker.experiment_id], query, max_results=_PAGE, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs
