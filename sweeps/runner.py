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

Steps 3 to 5 are the sweep's `Scheduler` (`sweeps.scheduler`) on the one `Driver`; the rest is
`SweepRun`, the owner of the sweep's life, with the display (`sweeps.display`) and MLflow
(`sweeps.tracking`) as listeners of the driver. Only this driver writes the ledger, the study and
MLflow; a task only trains. Writes to the Optuna storage are retried through database blips like
the ledger's (`store.transient`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from dapo_ablate.ablation.experiment.spec import run_root
from dapo_ablate.ablation.runtime.driver import Driver, DriverOptions, RunListener
from dapo_ablate.ablation.runtime.executor import session
from dapo_ablate.ablation.runtime.hosts import this_host
from dapo_ablate.ablation.runtime.left_behind import recover_left_behind
from dapo_ablate.ablation.runtime.pool import PoolSettings, ResultKeeper, concurrency_limit
from dapo_ablate.ablation.runtime.preflight import check_contexts
from dapo_ablate.ablation.runtime.ray_connect import capacity
from dapo_ablate.ablation.runtime.signals import INTERRUPTED_EXIT, TERMINATED_EXIT, Interrupted
from dapo_ablate.ablation.runtime.task import resolve_cell_fn
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import connect_ledger
from dapo_ablate.ablation.store.tracking import default_artifact_location, open_tracker
from dapo_ablate.core.config import ConfigError
from dapo_ablate.core.contracts import RESULT_KEYS
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.display import TrialDisplay
from dapo_ablate.sweeps.knobs import params_digits
from dapo_ablate.sweeps.scheduler import SweepScheduler
from dapo_ablate.sweeps.spec import SweepSpec
from dapo_ablate.sweeps.tracking import SweepTracker
from dapo_ablate.sweeps.trials import plan_trial


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
    life = SweepRun(spec, fn, progress=progress, n_trials=n_trials, local=not address)
    # the study is opened before Ray starts: a database mistake is reported at once
    with session(spec, address, open_first=life.open_study, interrupted=SweepInterrupted) as (stop, _):
        life.check_stop = stop.check
        try:
            summary = life.run()
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



# ------------------------------------------------------------------------------- the owner
class SweepRun(RunListener):
    """The one owner of a sweep's life in one invocation (see the module docstring): its stores,
    the recovery, the driver with the sweep's `SweepScheduler` and its listeners (the display,
    this owner's MLflow logging of each finished trial), and the end."""

    def __init__(self, spec: SweepSpec, cell_fn, *, progress: bool, n_trials: int | None, local: bool) -> None:
        self.spec, self.cell_fn, self.local = spec, cell_fn, local
        self.n_trials = n_trials or spec.n_trials or 1
        if spec.sampler.type == "grid":  # a grid runs out of new points
            self.n_trials = min(self.n_trials, spec.grid_size)
        self.host = this_host()
        self.tick_s = min(spec.heartbeat.interval_s, spec.executor.lease_s / 4, 30.0)
        self.run_root = run_root(spec)
        self.scheduler: SweepScheduler | None = None
        """The trials and their runs (created with the study)."""
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
        self.scheduler = SweepScheduler(spec, self.study, self.storage, self.ledger, self.n_trials)

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
        for note in recover_left_behind(
                self.ledger, self.keeper, self.spec.name, self.host,
                undone=lambda: [row["run_id"] for row in self.ledger.runs_table(self.spec.name) if row["status"] != "done"],
                label=lambda run_id: f"run {run_id}"):
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
        options = DriverOptions(check_stop=self.check_stop, tick_s=self.tick_s, listeners=(self.display, self))
        Driver(self.scheduler, settings, self.ledger, self.host, self.cell_fn, options).run()


    # -- the driver's listener: a trial's end logged to MLflow ------------------------------------

    def trial_finished(self, trial: optuna.trial.FrozenTrial) -> None:
        self._log_trial(trial)

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
        summary.finished_now, summary.failures = self.scheduler.finished_now, dict(self.scheduler.failures)
        summary.wall_s = time.time() - started

