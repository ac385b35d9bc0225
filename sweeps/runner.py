"""Run a sweep: Optuna asks knob settings, their runs train as Ray tasks, results are told back.

`run_sweep(spec)` is what ``dapo-ablate sweep`` does:

1. the executor's checks (folders, Ray address) and its local Ray; open the ledger, the study
   (`sweeps.study`) and the MLflow parent run;
2. recover what a dead driver left: running trials of a gone process on this host are failed and
   queued again at once (others' after the heartbeat's grace period); its ledger runs are put
   back to pending; finished trials it had not logged to MLflow are logged;
3. while the budget has room and the cluster has a free slot, ask a trial, record its runs in the
   ledger (a run already done there is not trained again) and submit the others as Ray tasks,
   declaring the executor's ``cpus_per_run``/``gpus_per_run``, at most ``max_concurrent`` (else
   as many as fit) at a time;
4. each task streams its evaluations to the driver; when every seed of the trial's objective
   cell has evaluated a step, the mean is reported to the pruner (`Trial.report`); if the pruner
   says so, the trial's tasks are cancelled, their runs go back to pending and the trial is told
   PRUNED. A failed run is retried ``executor.retries`` times, then its trial is told FAIL with
   the error as user attr ``error``. When every run is done the trial is told its value
   (`sweeps.trials`) and logged to MLflow;
5. heartbeats: the ledger's leases of the runs in flight and Optuna's trial heartbeats; Ctrl-C
   cancels everything in flight and queues the running trials again (exit 130).

Only this driver writes the ledger, the study and MLflow; a task only trains.

The Ray task and the cell function that stream evaluations are in `sweeps.tasks`.
"""

from __future__ import annotations

import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from dapo_ablate.ablation.executor import (
    INTERRUPTED_EXIT,
    ExecutorError,
    capacity,
    connect_ray,
    describe_error,
    open_tracker,
    preflight,
    release_orphans,
    resolve_cell_fn,
    this_host,
)
from dapo_ablate.ablation.ledger import Ledger
from dapo_ablate.ablation.tracking import default_artifact_location
from dapo_ablate.core.config import ConfigError
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.display import TrialDisplay
from dapo_ablate.sweeps.spec import SweepSpec
from dapo_ablate.sweeps.tasks import run_streaming
from dapo_ablate.sweeps.tracking import SweepTracker
from dapo_ablate.sweeps.trials import TrialPlan, factor_effects, format_params, plan_trial, trial_value

_ALWAYS_CLAIMABLE = 2**31 - 1  # retries are counted per invocation, as the executor does
_RESULT_KEYS = ("metrics", "eval_curve", "signals", "tokens_generated", "tokens_discarded", "wall_s")
"""A ledger results row's keys that make a run result (what `Ledger.finish` stores)."""


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
    interrupted: bool = False
    wall_s: float = 0.0
    failures: dict[int, str] = field(default_factory=dict)
    """Trial number -> error of the trials that failed in this invocation."""

    @property
    def exit_code(self) -> int:
        """0 once n_trials trials have finished and one of them is complete; 130 after Ctrl-C; else 1."""
        if self.interrupted:
            return INTERRUPTED_EXIT
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
    address = address if address is not None else spec.executor.address
    preflight(spec, address)  # type: ignore[arg-type]  # reads only the fields both specs share
    driver = _SweepDriver(spec, fn, progress=progress, n_trials=n_trials, local=not address)
    driver.open_study()  # before Ray starts: a database mistake is reported at once
    started_ray = connect_ray(address, spec)  # type: ignore[arg-type]
    try:
        return driver.run()
    finally:
        if started_ray:
            import ray

            ray.shutdown()


# ---------------------------------------------------------------------------------- driver
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


class _SweepDriver:
    """One invocation's state: stores, the study, the trials and tasks in flight."""

    def __init__(self, spec: SweepSpec, cell_fn, *, progress: bool, n_trials: int | None, local: bool) -> None:
        self.spec, self.cell_fn, self.local = spec, cell_fn, local
        self.n_trials = n_trials or spec.n_trials or 1
        if spec.sampler.type == "grid":  # a grid runs out of new points
            self.n_trials = min(self.n_trials, spec.grid_size)
        self.host = this_host()
        executor = spec.executor
        self.retries, self.lease_s = executor.retries, executor.lease_s
        self.tick_s = min(spec.heartbeat.interval_s, executor.lease_s / 4, 30.0)
        root = Path(spec.output_dir).expanduser().resolve()
        self.run_root = root / re.sub(r"[^\w.-]+", "_", spec.name)
        self.eval_cache = root / "eval-cache"
        self.active: dict[int, _ActiveTrial] = {}
        self.queue: deque[tuple[int, str]] = deque()
        """(trial number, run id) waiting for a slot."""
        self.in_flight: dict[Any, tuple[int, str]] = {}
        """Ray generator -> (trial number, run id)."""
        self.held_elsewhere: set[tuple[int, str]] = set()
        """Runs another driver (or another trial of ours) is training: re-checked every tick."""
        self.summary = SweepSummary(spec.name, self.n_trials)
        self.display = TrialDisplay(self.n_trials, spec.metric, spec.direction, progress)

    def run(self) -> SweepSummary:
        started = time.time()
        self._open_tracking()
        self._recover()
        try:
            with self.display:
                self.display.start(studies.counted_trials(self.study.get_trials(deepcopy=False)))
                self._loop()
        except KeyboardInterrupt:
            self.summary.interrupted = True
        finally:
            self._abandon()
            self._summarize(started)
            status = "KILLED" if self.summary.interrupted else "FINISHED" if self.summary.exit_code == 0 else "FAILED"
            self._finish_tracking(status)
            self.ledger.close()
            self.storage.engine.dispose()
        return self.summary

    # -- set-up ---------------------------------------------------------------------------------

    def open_study(self) -> None:
        """Open the ledger (refusing a factorial experiment's name) and create or load the study."""
        spec = self.spec
        self.ledger = Ledger(spec.ledger)
        record = self.ledger.get_experiment(spec.name)
        if record is not None and "space" not in record.spec:
            raise ExecutorError(
                f"the ledger at {self.ledger.url} already has a factorial experiment named {spec.name!r}; give the sweep another name"
            )
        self.ledger.ensure_experiment(spec.name, spec.to_dict())
        self.storage = studies.open_storage(spec)
        self.study = studies.open_study(spec, self.storage)
        self.study.set_user_attr("dapo.space", {leaf: dim.model_dump(mode="json") for leaf, dim in spec.space.items()})
        self.study.set_user_attr("dapo.metric", spec.metric)
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
        studies.fail_stale(self.study)
        release_orphans(self.ledger, self.spec.name, self.host)
        self.logged = self.mlflow.logged_trials()
        for trial in self.study.get_trials(deepcopy=False, states=studies.FINISHED):
            if trial.number not in self.logged:
                self._log_trial(trial)

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        import ray

        self.task = ray.remote(run_streaming)
        executor = self.spec.executor
        self.resources = {"num_cpus": executor.cpus_per_run, "num_gpus": executor.gpus_per_run}
        fits = capacity(self.spec, 2**31)  # type: ignore[arg-type]
        # As in the executor: a local Ray cannot run more than fits here (more would wait in
        # Ray's queue while the ledger calls them running); a cluster may autoscale.
        self.limit = min(executor.max_concurrent or fits, fits) if self.local else (executor.max_concurrent or fits)
        last_beat = time.monotonic()
        while True:
            self._fill()
            if not self.in_flight and not self.queue and not self.held_elsewhere:
                return
            if self.in_flight:
                ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=self.tick_s)
            else:  # only waiting on runs another driver holds
                ready = []
                time.sleep(self.tick_s)
            if time.monotonic() - last_beat >= self.tick_s:
                self._beat()
                last_beat = time.monotonic()
            for generator in ready:
                if generator in self.in_flight:  # a prune may have cancelled it meanwhile
                    self._advance(generator)

    def _fill(self) -> None:
        """Submit queued runs while slots are free, asking new trials when the queue is empty."""
        while len(self.in_flight) < self.limit:
            if not self.queue:
                if not studies.may_ask(self.study, self.n_trials):
                    return
                self._start_trial()
                continue
            number, run_id = self.queue.popleft()
            if number in self.active:
                self._submit(self.active[number], run_id)

    def _start_trial(self) -> None:
        trial = studies.ask(self.study, self.spec, self.host)
        try:
            plan = plan_trial(self.spec, trial.number, trial.params)
        except (ConfigError, KeyError) as err:  # a sampled combination the trainer refuses
            self._fail(trial, str(err))
            return
        active = _ActiveTrial(trial, plan)
        self.active[trial.number] = active
        trial.set_user_attr("runs", {run.run_id: run.name for run in plan.runs})
        self.ledger.add_runs(self.spec.name, [run.to_run_spec() for run in plan.runs])
        done = {row["run_id"]: row for row in self.ledger.results(self.spec.name) if row["run_id"] in plan.by_id}
        self.display.started(trial.number, format_params(trial.params), len(plan.runs), len(done))
        for run in plan.runs:
            if run.run_id not in done:
                self.queue.append((trial.number, run.run_id))
        for run_id, row in done.items():  # trained before (another trial, a factorial, a dead driver)
            if trial.number in self.active:
                self._run_done(active, run_id, {key: row[key] for key in _RESULT_KEYS})

    def _submit(self, active: _ActiveTrial, run_id: str) -> None:
        if not self.ledger.claim(run_id, self.host, lease_s=self.lease_s, max_attempts=_ALWAYS_CLAIMABLE):
            self.held_elsewhere.add((active.number, run_id))
            return
        active.tries[run_id] += 1
        run = active.plan.by_id[run_id]
        generator = self.task.options(max_retries=0, **self.resources).remote(
            self.cell_fn, run.config.to_dict(), str(self.run_root / run_id), str(self.eval_cache)
        )
        self.in_flight[generator] = (active.number, run_id)

    def _advance(self, generator: Any) -> None:
        """Take the next event of a task: an evaluation, its result, or its error."""
        import ray

        number, run_id = self.in_flight[generator]
        active = self.active.get(number)
        try:
            event = ray.get(next(generator))
        except StopIteration:
            event = None
        except Exception as err:  # the run's failure, not the driver's: record it and go on
            self.in_flight.pop(generator)
            self._run_failed(active, run_id, err)
            return
        if event is None or event[0] == "result":
            self.in_flight.pop(generator)
        if event is None or active is None:
            return
        if event[0] == "eval":
            self._on_eval(active, run_id, event[1], event[2])
        else:
            self._finish_run(active, run_id, event[1])

    def _beat(self) -> None:
        for number, run_id in self.in_flight.values():
            self.ledger.heartbeat(run_id, self.host)
        for active in self.active.values():  # before the stale check, so ours are never stale
            self.storage.record_heartbeat(active.trial._trial_id)
        studies.fail_stale(self.study)
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
            active.trial.report(sum(curve[step] for curve in curves) / len(curves), step)
            active.reported.add(step)
            if step < last and len(active.results) < len(active.plan.runs) and active.trial.should_prune():
                self._prune(active, step)
                return

    def _finish_run(self, active: _ActiveTrial, run_id: str, result: dict[str, Any]) -> None:
        if not self.ledger.finish(run_id, result):  # another driver finished it meanwhile
            result = self._stored_result(run_id) or result
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

    def _run_failed(self, active: _ActiveTrial | None, run_id: str, err: BaseException) -> None:
        error = describe_error(err)
        self.ledger.fail(run_id, error, self.host)
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
                return {key: row[key] for key in _RESULT_KEYS}
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
            frozen = self.study.tell(trial, value, state=state) if value is not None else self.study.tell(trial, state=state)
        except optuna.exceptions.UpdateFinishedTrialError:  # failed as stale by another driver meanwhile
            self.display.note(f"trial {trial.number}: was marked stale meanwhile; its outcome is dropped")
            return
        self.summary.finished_now += 1
        self.display.finished(frozen)
        self._log_trial(frozen)

    def _stop_runs(self, active: _ActiveTrial) -> None:
        """Cancel the trial's tasks in flight and give their runs back; drop its queued runs."""
        import ray

        for generator, (number, run_id) in list(self.in_flight.items()):
            if number == active.number:
                self.ledger.release(run_id, self.host)  # first: Ctrl-C may have stopped Ray itself
                del self.in_flight[generator]
                try:
                    ray.cancel(generator, force=True)
                except Exception:  # noqa: BLE001 - a Ray stopped by Ctrl-C has nothing left to cancel
                    pass
        self.queue = deque(item for item in self.queue if item[0] != active.number)
        self.held_elsewhere = {item for item in self.held_elsewhere if item[0] != active.number}

    def _abandon(self) -> None:
        """Ctrl-C or a driver error: stop every task and queue the running trials again."""
        for active in list(self.active.values()):
            self._stop_runs(active)
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
                runs = [(run, {key: stored[run.run_id][key] for key in _RESULT_KEYS}) for run in plan.runs if run.run_id in stored]
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
        summary.wall_s = time.time() - started
