"""The Optuna sweep as a `Scheduler` of the one `Driver` (`ablation.runtime.driver`): which run
starts next (the queued runs of the trials in flight, a new trial asked when none is queued),
what an outcome changes (a run recorded, retried or failing its trial; a trial told COMPLETE,
PRUNED or FAIL), when the sweep is finished, and what is a sweep's own: its evaluations reported
to the pruner as they stream (`event`), the trials' Optuna heartbeats (`on_tick`), and the
running trials queued again when the driver stops (`abandoned`). The sweep's owner
(`sweeps.runner`) opens the stores, recovers, builds the driver and ends the sweep; the
display and MLflow hear a trial's start and end through the driver's listeners
(`Listeners.tell`: ``trial_started``, ``trial_finished``). This module imports neither MLflow nor
the display."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from dapo_ablate.ablation.runtime.driver import Listeners, RunListener, RunRequest
from dapo_ablate.ablation.runtime.pool import DONE, FAILED, LOST, TIMED_OUT, Outcome, RunPool
from dapo_ablate.ablation.store.ledger import Ledger
from dapo_ablate.ablation.store.transient import OPTUNA, Retrying, retry_transient
from dapo_ablate.core.config import ConfigError
from dapo_ablate.core.contracts import RESULT_KEYS
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.knobs import format_params, params_digits
from dapo_ablate.sweeps.spec import SweepSpec
from dapo_ablate.sweeps.trials import TrialPlan, factor_effects, plan_trial, trial_value

_ALWAYS_CLAIMABLE = 2**31 - 1  # retries are counted per invocation, as the executor does


@dataclass
class _ActiveTrial:
    trial: optuna.Trial
    plan: TrialPlan
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
    """Run id -> step -> objective metric, from streamed (or stored) evaluations."""
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    reported: set[int] = field(default_factory=set)
    tries: Counter = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)

    @property
    def number(self) -> int:
        return self.trial.number


class SweepScheduler(RunListener):
    """The trials in flight and the runs they wait for (see the module docstring); a listener of
    its driver for the runs' evaluations and the driver's stop."""

    def __init__(self, spec: SweepSpec, study: optuna.Study, storage: Any, ledger: Ledger, n_trials: int) -> None:
        self.spec, self.study, self.storage, self.ledger, self.n_trials = spec, study, storage, ledger, n_trials
        self.retries = spec.executor.retries
        self.active: dict[int, _ActiveTrial] = {}
        self.queue: deque[tuple[int, str]] = deque()
        """(trial number, run id) waiting for a slot."""
        self.pool: RunPool | None = None
        """The runs in flight (set when the driver starts)."""
        self.listeners = Listeners([])
        """Whom the scheduler tells a trial's start and end, and its notes (set when the driver starts)."""
        self.trial_of: dict[str, int] = {}
        """Run id -> the trial number it was submitted for."""
        self.asked_for: dict[str, int] = {}
        """Run id -> the trial number of a run handed to the driver and not yet submitted."""
        self.held_elsewhere: set[tuple[int, str]] = set()
        """Runs another driver (or another trial of ours) is training: re-checked every tick."""
        self.failures: dict[int, str] = {}
        """Trial number -> error of the trials that failed in this invocation."""
        self.finished_now = 0
        """Trials this invocation finished."""

    # -- the Scheduler protocol (ablation.runtime.driver) -----------------------------------------

    def start(self, pool: RunPool, listeners: Listeners) -> None:
        self.pool, self.listeners = pool, listeners

    def next_run(self) -> RunRequest | None:
        """The next queued run of a trial still active, asking new trials when the queue is empty."""
        while True:
            if not self.queue:
                if not studies.may_ask(self.study, self.n_trials):
                    return None
                self._start_trial()
                continue
            number, run_id = self.queue.popleft()
            if number in self.active:
                self.asked_for[run_id] = number
                run = self.active[number].plan.by_id[run_id]
                return RunRequest(run_id, run.config.to_dict(), _ALWAYS_CLAIMABLE, name=run.name)

    def submitted(self, request: RunRequest, accepted: bool) -> None:
        number = self.asked_for.pop(request.run_id)
        if not accepted:
            self.held_elsewhere.add((number, request.run_id))  # another driver, or another trial of ours
            return
        self.active[number].tries[request.run_id] += 1
        self.trial_of[request.run_id] = number

    def finished(self) -> bool:
        return not self.queue and not self.held_elsewhere

    def on_outcome(self, outcome: Outcome) -> None:
        """What became of one run in flight (the trial's lines and MLflow run come from its end:
        nothing to settle for the listeners here)."""
        self._settle(outcome)

    def on_tick(self) -> None:
        self._beat()

    def _start_trial(self) -> None:
        trial = retry_transient(lambda: studies.ask(self.study, self.spec), "ask a trial", store=OPTUNA)
        try:
            plan = plan_trial(self.spec, trial.number, trial.params)
        except (ConfigError, KeyError) as err:  # a sampled combination the trainer refuses
            self._fail(trial, str(err))
            return
        active = _ActiveTrial(trial, plan)
        self.active[trial.number] = active
        trial.set_user_attr("runs", {run.run_id: run.name for run in plan.runs})
        Retrying(self.ledger).add_runs(self.spec.name, [run.to_run_spec() for run in plan.runs],
                                       doing=f"record trial {trial.number}'s runs")
        done = {row["run_id"]: row for row in self.ledger.results(self.spec.name) if row["run_id"] in plan.by_id}
        self.listeners.tell("trial_started", trial.number, self._params_text(trial.params), len(plan.runs), len(done))
        for run in plan.runs:
            if run.run_id not in done:
                self.queue.append((trial.number, run.run_id))
        for run_id, row in done.items():  # trained before (another trial, a factorial, a dead driver)
            if trial.number in self.active:
                self._run_done(active, run_id, {key: row[key] for key in RESULT_KEYS})

    def _settle(self, outcome: Outcome) -> None:
        """What became of one run in flight: its result, its failure, its timeout or its lease."""
        run_id = outcome.run_id
        number = self.trial_of.pop(run_id, None)
        active = self.active.get(number) if number is not None else None
        if outcome.kind == DONE:
            self._finish_run(active, run_id, outcome.result or {})
        elif outcome.kind == FAILED:
            self._run_failed(active, run_id, outcome.error)
        elif outcome.kind == TIMED_OUT and active is not None:  # failed in the ledger by the pool
            self._stop_runs(active)
            self._fail(active.trial, f"{active.plan.by_id[run_id].name}: {outcome.error}")
        elif outcome.kind == LOST and number is not None:  # the taker's result is picked up by _beat
            self.held_elsewhere.add((number, run_id))

    def _params_text(self, params: dict[str, Any]) -> str:
        """A trial's knobs as the report shows them: each rounded to the digits that keep the
        study's values of it apart (those sampled so far; `sweeps.knobs`)."""
        trials = Retrying(self.study, OPTUNA).get_trials(deepcopy=False, doing="read the study's trials")
        return format_params(params, params_digits([*(t.params for t in trials), params]))

    def _beat(self) -> None:
        for active in self.active.values():  # before the stale check, so ours are never stale
            Retrying(self.storage, OPTUNA).record_heartbeat(active.trial._trial_id, doing=f"record trial {active.number}'s heartbeat")
        grace_s = self.spec.heartbeat.grace_period_s
        for number in retry_transient(lambda: studies.fail_stale(self.study, grace_s), "fail stale trials", store=OPTUNA):
            self.listeners.note(f"trial {number}: its driver stopped; queued again")
        for number, run_id in list(self.held_elsewhere):
            self.held_elsewhere.discard((number, run_id))
            active = self.active.get(number)
            if active is None:
                continue
            stored = self._stored_result(run_id)
            if stored is not None:
                self._run_done(active, run_id, stored)
            else:
                self.queue.append((number, run_id))

    # -- run events -----------------------------------------------------------------------------

    def event(self, run_id: str, kind: str, step: int, data: dict[str, Any]) -> None:
        """A run's live event: its evaluations go to the pruner (training steps are not used)."""
        active = self.active.get(self.trial_of.get(run_id, -1))
        if kind == "eval" and active is not None:
            self._on_eval(active, run_id, step, data)

    def _on_eval(self, active: _ActiveTrial, run_id: str, step: int, metrics: dict[str, Any]) -> None:
        value = metrics.get(self.spec.metric)
        if isinstance(value, (int, float)):
            active.curves.setdefault(run_id, {})[int(step)] = float(value)
        self._report(active)

    def _report(self, active: _ActiveTrial) -> None:
        """Report each step every objective run has evaluated (their mean) and ask the pruner.
        Step 0 is skipped: it is the policy before training, the same for every knob setting.
        The last step is reported but never pruned on: its runs have done all their training."""
        objective = active.plan.objective_runs
        last = min(run.config.schedule.total_steps for run in objective)
        curves = [active.curves.get(run.run_id, {}) for run in objective]
        steps = set.intersection(*(set(curve) for curve in curves)) - active.reported - {0}
        for step in sorted(steps):
            value = sum(curve[step] for curve in curves) / len(curves)
            Retrying(active.trial, OPTUNA).report(value, step, doing=f"report trial {active.number}'s step {step}")
            active.reported.add(step)
            if step < last and len(active.results) < len(active.plan.runs) and Retrying(active.trial, OPTUNA).should_prune(
                doing=f"ask the pruner about trial {active.number}"
            ):
                self._prune(active, step)
                return

    def _finish_run(self, active: _ActiveTrial | None, run_id: str, result: dict[str, Any]) -> None:
        """Record a finished run (kept on disk until the ledger holds it), even when its trial
        ended meanwhile: a finished run is never paid for twice."""
        if not self.pool.record(run_id, result):  # another driver finished it meanwhile
            result = self._stored_result(run_id) or result
        if active is not None:
            self._run_done(active, run_id, result)

    def _run_done(self, active: _ActiveTrial, run_id: str, result: dict[str, Any]) -> None:
        active.results[run_id] = result
        for row in result.get("eval_curve") or []:  # a cell function that did not stream
            if "step" in row and int(row["step"]) not in active.curves.get(run_id, {}):
                self._on_eval(active, run_id, int(row["step"]), row)
                if active.number not in self.active:
                    return
        if len(active.results) == len(active.plan.runs):
            self._complete(active)

    def _run_failed(self, active: _ActiveTrial | None, run_id: str, error: str) -> None:
        self.pool.fail(run_id, error)
        if active is None:
            return
        name = active.plan.by_id[run_id].name
        if active.tries[run_id] <= self.retries:
            self.listeners.note(f"{name}: failed (attempt {active.tries[run_id]}), retrying: {error}")
            self.queue.appendleft((active.number, run_id))
            return
        self._stop_runs(active)
        self._fail(active.trial, f"{name}: {error}")

    def _stored_result(self, run_id: str) -> dict[str, Any] | None:
        for row in self.ledger.results(self.spec.name):
            if row["run_id"] == run_id:
                return {key: row[key] for key in RESULT_KEYS}
        return None

    # -- trial outcomes -------------------------------------------------------------------------

    def _complete(self, active: _ActiveTrial) -> None:
        plan, metric = active.plan, self.spec.metric
        metric_of = {}
        for run in plan.runs:
            value = (active.results[run.run_id].get("metrics") or {}).get(metric)
            if not isinstance(value, (int, float)):
                self._fail(active.trial, f"{run.name}: its result has no {metric}")
                return
            metric_of[run.run_id] = float(value)
        trial = active.trial
        trial.set_user_attr("per_seed", [metric_of[run.run_id] for run in plan.objective_runs])
        trial.set_user_attr("wall_s", sum(float(r.get("wall_s") or 0) for r in active.results.values()))
        trial.set_user_attr("tokens_generated", sum(int(r.get("tokens_generated") or 0) for r in active.results.values()))
        if plan.factors:
            effects = factor_effects(plan, metric_of, self.spec.factor_design)
            trial.set_user_attr("effects", {name: effect.to_dict() for name, effect in effects.items()})
        self._tell(trial, TrialState.COMPLETE, trial_value(plan, metric_of))

    def _prune(self, active: _ActiveTrial, step: int) -> None:
        self._stop_runs(active)
        active.trial.set_user_attr("pruned_at_step", step)
        self._tell(active.trial, TrialState.PRUNED)

    def _fail(self, trial: optuna.Trial, error: str) -> None:
        trial.set_user_attr(studies.ERROR_ATTR, error)
        self.failures[trial.number] = error
        self._tell(trial, TrialState.FAIL)

    def _tell(self, trial: optuna.Trial, state: TrialState, value: float | None = None) -> None:
        self.active.pop(trial.number, None)
        try:
            frozen = retry_transient(
                lambda: self.study.tell(trial, value, state=state) if value is not None else self.study.tell(trial, state=state),
                f"tell trial {trial.number}", store=OPTUNA,
            )
        except optuna.exceptions.UpdateFinishedTrialError:  # failed as stale by another driver meanwhile
            self.listeners.note(f"trial {trial.number}: was marked stale meanwhile; its outcome is dropped")
            return
        self.finished_now += 1
        self.listeners.tell("trial_finished", frozen)

    def _stop_runs(self, active: _ActiveTrial) -> None:
        """Cancel the trial's runs in flight (their Ray jobs too) and give them back; drop its
        queued runs."""
        for run_id, number in list(self.trial_of.items()):
            if number == active.number:
                del self.trial_of[run_id]
                self.pool.cancel(run_id)
        self.queue = deque(item for item in self.queue if item[0] != active.number)
        self.held_elsewhere = {item for item in self.held_elsewhere if item[0] != active.number}

    def abandoned(self, released: list[str]) -> None:
        """Ctrl-C, SIGTERM or a driver error: every run in flight went back to pending (a Ray job
        keeps running for the next invocation to re-attach to); the running trials are queued
        again."""
        self.trial_of.clear()
        for active in list(self.active.values()):
            studies.fail_and_requeue(self.study, active.trial._trial_id, "its driver was interrupted; queued again")
        self.active.clear()

