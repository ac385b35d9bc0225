"""Run a sweep: Optuna asks knob settings, their runs train as Ray tasks, results are told back.

`run_sweep(spec)` is what ``dapo-ablate sweep`` does:

1. the executor's checks (folders, Ray address) and its local Ray; open the ledger, the study
   (`sweeps.study`) and the MLflow parent run;
2. recover what a dead driver left: running trials of a gone process on this host are failed and
   queued again at once (others' after the heartbeat's grace period); its ledger runs are put
   back to pending; finished trials it had not logged to MLflow are logged;
3. while the budget has room and the cluster has a free slot, ask a trial, record its runs in the
   ledger (a run already done there is not trained again) and submit the others to the run pool
   (`ablation.pool`, the executor's: claims, leases, ``executor.run_timeout_s``, kept results and
   retried database writes are the same as a factorial's), at most ``max_concurrent`` (else as
   many as fit) at a time;
4. each task sends its evaluations to the driver as it trains; when every seed of the trial's objective
   cell has evaluated a step, the mean is reported to the pruner (`Trial.report`); if the pruner
   says so, the trial's tasks are cancelled, their runs go back to pending and the trial is told
   PRUNED. A failed run is retried ``executor.retries`` times, then its trial is told FAIL with
   the error as user attr ``error``. When every run is done the trial is told its value
   (`sweeps.trials`) and logged to MLflow;
5. heartbeats: the ledger's leases of the runs in flight (the pool's) and Optuna's trial
   heartbeats; a run that times out fails its trial; Ctrl-C or SIGTERM cancels everything in
   flight and queues the running trials again (exit 130, 143).

Only this driver writes the ledger, the study and MLflow; a task only trains. Writes to the
Optuna storage are retried through database blips like the ledger's (`ablation.transient`).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from dapo_ablate.ablation.experiment.spec import run_root
from dapo_ablate.ablation.runtime.driver import Driver, DriverOptions, Listeners, RunRequest
from dapo_ablate.ablation.runtime.executor import session
from dapo_ablate.ablation.runtime.hosts import release_orphans, this_host
from dapo_ablate.ablation.runtime.pool import (
    DONE,
    FAILED,
    LOST,
    TIMED_OUT,
    Outcome,
    PoolSettings,
    ResultKeeper,
    RunPool,
    concurrency_limit,
    record_kept,
)
from dapo_ablate.ablation.runtime.preflight import check_contexts
from dapo_ablate.ablation.runtime.ray_connect import capacity
from dapo_ablate.ablation.runtime.signals import INTERRUPTED_EXIT, TERMINATED_EXIT, Interrupted
from dapo_ablate.ablation.runtime.task import resolve_cell_fn
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import connect_ledger
from dapo_ablate.ablation.store.tracking import default_artifact_location, open_tracker
from dapo_ablate.ablation.store.transient import OPTUNA, Retrying, retry_transient
from dapo_ablate.core.config import ConfigError
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.display import TrialDisplay
from dapo_ablate.sweeps.knobs import format_params, params_digits
from dapo_ablate.sweeps.spec import SweepSpec
from dapo_ablate.sweeps.tracking import SweepTracker
from dapo_ablate.sweeps.trials import TrialPlan, factor_effects, plan_trial, trial_value
from dapo_ablate.core.contracts import RESULT_KEYS

_ALWAYS_CLAIMABLE = 2**31 - 1  # retries are counted per invocation, as the executor does


@dataclass
class SweepSummary:
    """What one `run_sweep` invocation did, and where the study stands now."""

    name: str
    n_trials: int
    states: dict[str, int] = field(default_factory=dict)
    """Optuna state name -> number of the study's trials (COMPLETE, PRUNED, FAIL, RUNNING, WAITING)."""
    counted: int = 0
    """Finished trials counting towards n_trials (a failed trial queued again does not)."""
    finished_now: int = 0
    recovered: list[int] = field(default_factory=list)
    """Trials a dead driver on this host left running, failed and queued again at start-up."""
    best_number: int | None = None
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    knob_digits: dict[str, int] = field(default_factory=dict)
    """Per knob, the significant digits the report shows its values with (`sweeps.knobs.params_digits`
    over the study's trials): ``format_params(best_params, knob_digits)`` reads as the report does."""
    interrupted: bool = False
    terminated: bool = False
    """The interruption was a SIGTERM (a scheduler's or `kill`'s stop), not Ctrl-C."""
    wall_s: float = 0.0
    failures: dict[int, str] = field(default_factory=dict)
    """Trial number -> error of the trials that failed in this invocation."""

    @property
    def exit_code(self) -> int:
        """0 once n_trials trials have finished and one of them is complete; 130 after Ctrl-C,
        143 after SIGTERM; else 1."""
        if self.interrupted:
            return TERMINATED_EXIT if self.terminated else INTERRUPTED_EXIT
        return 0 if self.counted >= self.n_trials and self.best_number is not None else 1


def run_sweep(
    spec: SweepSpec,
    *,
    address: str | None = None,
    n_trials: int | None = None,
    cell_fn: Callable[..., dict[str, Any]] | None = None,
    progress: bool = True,
) -> SweepSummary:
    """Run the sweep until `n_trials` (default: the spec's) trials have finished; see the module
    docstring. Raises ExecutorError / LedgerError / StudyError for a user's mistake."""
    fn = resolve_cell_fn(cell_fn)
    check_contexts(spec)  # a prompt + response ceiling beyond a model's context fails every trial
    address = address if address is not None else spec.executor.address
    scheduler = SweepScheduler(spec, fn, progress=progress, n_trials=n_trials, local=not address)
    # the study is opened before Ray starts: a database mistake is reported at once
    with session(spec, address, open_first=scheduler.open_study, interrupted=SweepInterrupted) as (stop, _):
        scheduler.check_stop = stop.check
        try:
            summary = scheduler.run()
            summary.terminated = bool(stop.received)
            return summary
        except KeyboardInterrupt:  # while opening MLflow or recovering, before any trial was asked
            raise SweepInterrupted(bool(stop.received)) from None


class SweepInterrupted(Interrupted):
    """Ctrl-C or SIGTERM before the sweep's driver started: no trial was asked or run (the study
    and its ledger entry may exist already)."""

    def __init__(self, terminated: bool) -> None:
        super().__init__(terminated)
        self.args = ("interrupted before any trial started; nothing was run (the study is kept for the next run)",)


# ------------------------------------------------------------------------------- scheduler
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


class SweepScheduler:
    """The Optuna sweep as a `Scheduler` of the one `Driver` (`ablation.runtime.driver`): one
    invocation's stores, the study, the trials and the runs they wait for."""

    def __init__(self, spec: SweepSpec, cell_fn, *, progress: bool, n_trials: int | None, local: bool) -> None:
        self.spec, self.cell_fn, self.local = spec, cell_fn, local
        self.n_trials = n_trials or spec.n_trials or 1
        if spec.sampler.type == "grid":  # a grid runs out of new points
            self.n_trials = min(self.n_trials, spec.grid_size)
        self.host = this_host()
        executor = spec.executor
        self.retries, self.lease_s = executor.retries, executor.lease_s
        self.tick_s = min(spec.heartbeat.interval_s, executor.lease_s / 4, 30.0)
        self.run_root = run_root(spec)
        self.active: dict[int, _ActiveTrial] = {}
        self.queue: deque[tuple[int, str]] = deque()
        """(trial number, run id) waiting for a slot."""
        self.pool: RunPool | None = None
        """The runs in flight (created when the loop starts)."""
        self.trial_of: dict[str, int] = {}
        """Run id -> the trial number it was submitted for."""
        self.asked_for: dict[str, int] = {}
        """Run id -> the trial number of a run handed to the driver and not yet submitted."""
        self.held_elsewhere: set[tuple[int, str]] = set()
        """Runs another driver (or another trial of ours) is training: re-checked every tick."""
        self.summary = SweepSummary(spec.name, self.n_trials)
        self.check_stop: Callable[[], None] = lambda: None
        """Raises KeyboardInterrupt for a Ctrl-C or SIGTERM that arrived where it could not be raised."""
        self.display = TrialDisplay(self.n_trials, spec.metric, spec.direction, progress)

    def run(self) -> SweepSummary:
        started = time.time()
        self._open_tracking()
        self._recover()
        failure: BaseException | None = None
        try:
            with self.display:
                self.display.start(studies.counted_trials(self.study.get_trials(deepcopy=False)))
                self._loop()
        except KeyboardInterrupt:
            self.summary.interrupted = True
        except BaseException as err:  # the first error is the one the user sees, whatever cleanup meets
            failure = err
        # each cleanup step on its own: a database that is down must not hide the error above
        for step in (lambda: self._summarize(started), self._finish_tracking_now, self.ledger.close,
                     self.storage.engine.dispose):
            try:
                step()
            except Exception as err:  # noqa: BLE001
                failure = failure or err
        if failure is not None:
            raise failure
        return self.summary

    def _finish_tracking_now(self) -> None:
        status = "KILLED" if self.summary.interrupted else "FINISHED" if self.summary.exit_code == 0 else "FAILED"
        self._finish_tracking(status)

    # -- set-up ---------------------------------------------------------------------------------

    def open_study(self) -> None:
        """Open the ledger (refusing a factorial experiment's name) and create or load the study."""
        spec = self.spec
        self.ledger = connect_ledger(spec.ledger)
        record = self.ledger.get_experiment(spec.name)
        if record is not None and "space" not in record.spec:
            raise ExecutorError(
                f"the ledger at {self.ledger.url} already has a factorial experiment named {spec.name!r}; give the sweep another name"
            )
        self.storage = studies.open_storage(spec, driver=self.host)
        self.study = studies.open_study(spec, self.storage)
        studies.check_resumable(self.study, spec)  # before anything of this spec is written
        self.ledger.ensure_experiment(spec.name, spec.to_dict())
        self.keeper = ResultKeeper(self.run_root, self.ledger.result_key(spec.name))  # read while the database is up
        self.study.set_user_attr(studies.SPACE_ATTR, studies.space_of(spec))
        self.study.set_user_attr(studies.METRIC_ATTR, spec.metric)
        self.study.set_user_attr("dapo.factors", [f if isinstance(f, str) else next(iter(f)) for f in spec.factors or []])
        self.study.set_user_attr("dapo.factor_design", spec.factor_design)

    def _open_tracking(self) -> None:
        spec = self.spec
        tracking = spec.tracking
        location = tracking.artifact_location or default_artifact_location(tracking.uri, spec.output_dir)
        tracker = open_tracker(tracking.uri, location, spec.name)
        record = self.ledger.get_experiment(spec.name)
        tags = {"dapo.kind": "sweep", "dapo.metric": spec.metric, "dapo.direction": spec.direction,
                "dapo.n_trials": str(self.n_trials), "dapo.sampler": spec.sampler.type, "dapo.pruner": spec.pruner.type,
                "dapo.space": ",".join(spec.space), "dapo.factors": ",".join(self.study.user_attrs["dapo.factors"]),
                "dapo.seeds_per_trial": str(spec.seeds_per_trial), "optuna.study": spec.name,
                "optuna.storage": self.ledger.url}
        parent_id = tracker.parent_run(record.mlflow_parent_run_id if record else None, name=spec.name, tags=tags)
        self.ledger.set_mlflow_parent(spec.name, parent_id)
        tracker.log_dict(parent_id, spec.to_dict(), "sweep.json")
        self.mlflow = SweepTracker(tracker, parent_id, spec.name, spec.metric)

    def _recover(self) -> None:
        self.summary.recovered = studies.recover_orphans(self.study)
        for number in self.summary.recovered:
            self.display.note(f"trial {number}: its driver stopped; queued again")
        for number in studies.fail_stale(self.study, self.spec.heartbeat.grace_period_s):
            self.display.note(f"trial {number}: its driver stopped; queued again")
        release_orphans(self.ledger, self.spec.name, self.host)
        for run_id in self.ledger.reopen_malformed(self.spec.name):  # stored unusable by an older version
            self.display.note(f"run {run_id}: its stored result was unusable; it trains again")
        undone = [row["run_id"] for row in self.ledger.runs_table(self.spec.name) if row["status"] != "done"]
        kept = record_kept(self.ledger, self.keeper, undone, host=self.host)  # a dead driver's finished runs
        for run_id in kept.recorded:
            self.display.note(f"run {run_id}: recorded its kept result (not retrained)")
        for note in kept.notes:
            self.display.note(note)
        self.logged = self.mlflow.logged_trials()
        for trial in self.study.get_trials(deepcopy=False, states=studies.FINISHED):
            if trial.number not in self.logged:
                self._log_trial(trial)

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        fits = capacity(self.spec, 2**31)  # type: ignore[arg-type]
        limit = concurrency_limit(fits, self.spec.executor.max_concurrent, self.local)
        settings = PoolSettings.of(self.spec.executor, limit, self.keeper)
        Driver(self, settings, self.ledger, self.host, self.cell_fn, DriverOptions(check_stop=self.check_stop, tick_s=self.tick_s)).run()

    # -- the Scheduler protocol (ablation.runtime.driver) -----------------------------------------

    def start(self, pool: RunPool, listeners: Listeners) -> None:
        self.pool = pool

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
                return RunRequest(run_id, run.config.to_dict(), _ALWAYS_CLAIMABLE)

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
        self.display.started(trial.number, self._params_text(trial.params), len(plan.runs), len(done))
        for run in plan.runs:
            if run.run_id not in done:
                self.queue.append((trial.number, run.run_id))
        for run_id, row in done.items():  # trained before (another trial, a factorial, a dead driver)
            if trial.number in self.active:
                self._run_done(active, run_id, {key: row[key] for key in RESULT_KEYS})

    def run_name(self, run_id: str) -> str:
        active = self.active.get(self.trial_of.get(run_id, -1))
        return active.plan.by_id[run_id].name if active is not None and run_id in active.plan.by_id else run_id

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
            self.display.note(f"trial {number}: its driver stopped; queued again")
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

    def on_event(self, run_id: str, kind: str, step: int, data: dict[str, Any]) -> None:
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
            self.display.note(f"{name}: failed (attempt {active.tries[run_id]}), retrying: {error}")
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
        self.summary.failures[trial.number] = error
        self._tell(trial, TrialState.FAIL)

    def _tell(self, trial: optuna.Trial, state: TrialState, value: float | None = None) -> None:
        self.active.pop(trial.number, None)
        try:
            frozen = retry_transient(
                lambda: self.study.tell(trial, value, state=state) if value is not None else self.study.tell(trial, state=state),
                f"tell trial {trial.number}", store=OPTUNA,
            )
        except optuna.exceptions.UpdateFinishedTrialError:  # failed as stale by another driver meanwhile
            self.display.note(f"trial {trial.number}: was marked stale meanwhile; its outcome is dropped")
            return
        self.summary.finished_now += 1
        self.display.finished(frozen)
        self._log_trial(frozen)

    def _stop_runs(self, active: _ActiveTrial) -> None:
        """Cancel the trial's runs in flight (their Ray jobs too) and give them back; drop its
        queued runs."""
        for run_id, number in list(self.trial_of.items()):
            if number == active.number:
                del self.trial_of[run_id]
                self.pool.cancel(run_id)
        self.queue = deque(item for item in self.queue if item[0] != active.number)
        self.held_elsewhere = {item for item in self.held_elsewhere if item[0] != active.number}

    def abandon(self, released: list[str]) -> None:
        """Ctrl-C, SIGTERM or a driver error: every run in flight went back to pending (a Ray job
        keeps running for the next invocation to re-attach to); the running trials are queued
        again."""
        self.trial_of.clear()
        for active in list(self.active.values()):
            studies.fail_and_requeue(self.study, active.trial._trial_id, "its driver was interrupted; queued again")
        self.active.clear()

    # -- MLflow and the summary -----------------------------------------------------------------

    def _log_trial(self, trial: optuna.trial.FrozenTrial) -> None:
        runs = []
        if trial.state != TrialState.FAIL or trial.user_attrs.get("runs"):
            try:
                plan = plan_trial(self.spec, trial.number, trial.params)
            except (ConfigError, KeyError):
                plan = None
            if plan is not None:
                stored = {row["run_id"]: row for row in self.ledger.results(self.spec.name) if row["run_id"] in plan.by_id}
                runs = [(run, {key: stored[run.run_id][key] for key in RESULT_KEYS}) for run in plan.runs if run.run_id in stored]
        self.logged[trial.number] = self.mlflow.log_trial(trial, runs)
        if trial.state == TrialState.COMPLETE:
            self._mark_best()

    def _mark_best(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        try:
            best = self.study.best_trial
        except ValueError:  # no complete trial yet
            best = None
        self.mlflow.mark_best(best, self.logged, studies.counted_trials(trials))

    def _finish_tracking(self, status: str) -> None:
        self._mark_best()
        self.mlflow.tracker.end_parent(self.mlflow.parent_id, status)

    def _summarize(self, started: float) -> None:
        trials = self.study.get_trials(deepcopy=False)
        summary = self.summary
        summary.states = dict(Counter(t.state.name for t in trials))
        summary.counted = studies.counted_trials(trials)
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        if complete:
            best = self.study.best_trial
            summary.best_number, summary.best_value, summary.best_params = best.number, best.value, dict(best.params)
        summary.knob_digits = params_digits(t.params for t in trials)
        summary.wall_s = time.time() - started
