"""The one owner of a factorial (or adaptive) experiment's life in one `run` invocation:
`ExperimentRun` opens the stores (the ledger, bound to the spec's design; MLflow's parent run),
recovers what a stopped driver left (runs a dead driver on this host held, results it kept on
disk, results stored unusable, leases expired after the last attempt, finished runs not logged to
MLflow), builds the one `Driver` with the design's `Scheduler` and its listeners (the display,
MLflow, the checkpoint pruner, this owner's tally), and ends the experiment (the parent run's
status, the summary). `executor.run_experiment` builds one after its checks and Ray connection."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from dapo_ablate.ablation.experiment.spec import run_root
from dapo_ablate.ablation.runtime.adaptive import AdaptiveScheduler, LookPolicy
from dapo_ablate.ablation.runtime.backends.registry import backend_of, jobs_at_once, runs_by_backend, time_limits_of
from dapo_ablate.ablation.runtime.backends.verl_checkpoints import prune_checkpoints
from dapo_ablate.ablation.runtime.driver import FAILED_ATTEMPT, RECORDED, Driver, DriverOptions, RunListener, Settled
from dapo_ablate.ablation.runtime.factorial import ExperimentSummary, FactorialScheduler, RunOptions
from dapo_ablate.ablation.runtime.hosts import this_host
from dapo_ablate.ablation.runtime.left_behind import recover_left_behind
from dapo_ablate.ablation.runtime.mlflow_runs import MlflowRuns
from dapo_ablate.ablation.runtime.pool import PoolSettings, ResultKeeper, concurrency_limit
from dapo_ablate.ablation.runtime.ray_connect import capacity
from dapo_ablate.ablation.runtime.run_display import RunDisplay
from dapo_ablate.ablation.runtime.task import describe_error
from dapo_ablate.ablation.store.binding import check_binding, experiment_digest
from dapo_ablate.ablation.store.database import experiment_lock
from dapo_ablate.ablation.store.ledger import DONE, FAILED, PENDING, RUNNING, Ledger, connect_ledger
from dapo_ablate.ablation.store.tracking import absolute_tracking_uri
from dapo_ablate.ablation.store.transient import Retrying, retry_transient

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec


class ExperimentRun(RunListener):
    """One invocation of `spec`'s `plan` (see the module docstring); a listener of its own driver
    for what the summary counts. `policy`: a ``design: adaptive`` experiment's looks."""

    def __init__(self, spec: ExperimentSpec, plan: Plan, cell_fn: Callable[..., dict[str, Any]], options: RunOptions,
                 ledger: Ledger | None = None, check_stop: Callable[[], None] | None = None,
                 policy: LookPolicy | None = None) -> None:
        self.spec, self.plan, self.cell_fn, self.options, self.ledger = spec, plan, cell_fn, options, ledger
        self.check_stop = check_stop or (lambda: None)
        """Raises KeyboardInterrupt if Ctrl-C or SIGTERM came, even one whose own interrupt a
        library swallowed (`signals.StopSignals`); asked at every step of the loop."""
        self.policy, self.name, self.host = policy, spec.name, this_host()
        self.summary = ExperimentSummary(self.name, {})
        self.scheduler: FactorialScheduler | None = None
        self.notes_before: list[str] = []
        """Lines for the display, gathered before it starts."""
        self.record: Callable[[], Any] = lambda: None
        """Records the spec in the experiment's folder (`executor.record_spec`), called once the
        ledger and MLflow have accepted it and before any store is written: a spec they refuse
        leaves the folder as it was."""

    @property
    def pool(self) -> Any:
        """The driver's pool once it started (None before)."""
        return self.scheduler.pool if self.scheduler is not None else None

    def run(self) -> ExperimentSummary:
        try:
            return self._run()
        finally:
            if self.ledger is not None:
                self.ledger.close()

    def _run(self) -> ExperimentSummary:
        started = time.time()
        self._open_stores()
        status = "FAILED"
        try:
            self._execute_plan()
        except KeyboardInterrupt:
            self.summary.interrupted = True
            status = "KILLED"
        rows = retry_transient(self.scheduler.plan_rows, "read where the runs stand")  # the summary and headline
        if not self.summary.interrupted and all(row["status"] == DONE for row in rows.values()):
            status = "FINISHED"
        self.mlflow.end(status, self.summary.interrupted)
        return self._summarise(rows, time.time() - started)

    # -- the stores and what a stopped driver left ---------------------------------------------

    def _open_stores(self) -> None:
        """The ledger is opened first and the spec checked against the experiment its name is bound
        to (`store.binding`), so a database that is not a ledger, or another design under this
        name, is refused before anything is written; so is a run the cluster cannot place
        (`Backend.prepare`). MLflow's store is opened under the experiment's lock (two drivers
        racing on a new store or parent)."""
        task_env: dict[str, dict[str, str]] = {}
        for backend, runs in runs_by_backend(self.plan):
            task_env.update(backend.prepare(self.spec, runs))
        time_limits = time_limits_of(self.spec, self.plan)
        self.ledger = self.ledger or connect_ledger(self.spec.ledger)
        scheduler_cls = AdaptiveScheduler if self.policy is not None else FactorialScheduler
        self.scheduler = scheduler_cls(self.spec, self.plan, self.ledger, *([self.policy] if self.policy else []))
        self.scheduler.task_env, self.scheduler.time_limits = task_env, time_limits
        self.mlflow = MlflowRuns(self.spec, self.plan, self.scheduler.planned, self.ledger)
        self.digest = experiment_digest(self.spec)
        check_binding(self.ledger.get_experiment(self.name), self.spec, self.ledger.url)
        with experiment_lock(self.spec.ledger, self.name):
            self._open_stores_locked()

    def _open_stores_locked(self) -> None:
        self.mlflow.open(self.digest)
        for backend, runs in runs_by_backend(self.plan):  # e.g. verl: every node has what a verl job needs
            backend.check_nodes(self.spec, runs)
        self.record()
        self._open_ledger_experiment()
        self.mlflow.open_parent(self.digest)

    def _open_ledger_experiment(self) -> None:
        """The experiment in the ledger, bound to its digest, with its runs; the key that seals
        kept results (read now, while the database is up); what a stopped driver left: runs held
        by a dead driver on this host, results it kept on disk, results an older version stored
        unusable."""
        self.ledger.ensure_experiment(self.name, self.spec.to_dict(), digest=self.digest)
        self.keeper = ResultKeeper(run_root(self.spec), self.ledger.result_key(self.name))
        self.ledger.add_runs(self.name, self.plan.run_specs())
        planned = self.scheduler.planned
        self.notes_before += recover_left_behind(
            self.ledger, self.keeper, self.name, self.host,
            undone=lambda: [run_id for run_id, row in self.scheduler.plan_rows().items() if row["status"] != DONE],
            label=lambda run_id: planned[run_id].name if run_id in planned else None)

    def _recover(self) -> dict[str, dict[str, Any]]:
        """The plan's finished runs are read once (the records the summary hands on) and those not
        in MLflow logged; with --retry-failed, failed runs get a fresh budget; a run whose lease
        expired after its last allowed attempt is failed. The plan's rows after all that."""
        scheduler = self.scheduler
        rows = scheduler.plan_rows()
        self.summary.already_done = sum(row["status"] == DONE for row in rows.values())
        scheduler.read_records()
        self.mlflow.log_unlogged(rows, scheduler.records)
        if self.options.retry_failed:
            reset = self.ledger.reset_failed(self.name, list(rows))
            self.notes_before.append(f"{self.name}: --retry-failed gave {reset} failed runs a fresh budget")
            rows = scheduler.plan_rows()
        self._fail_exhausted_leases(rows)
        return rows

    def _fail_exhausted_leases(self, rows: dict[str, dict[str, Any]]) -> None:
        """A run whose lease expired after its last allowed attempt (its drivers kept dying with
        it) is failed with that reason instead of being claimed forever."""
        attempts = self.spec.executor.retries + 1
        for run_id in self.ledger.expired_leases(self.name, lease_s=self.spec.executor.lease_s):
            if run_id in rows and rows[run_id]["attempts"] >= attempts:
                self.ledger.fail(run_id, f"LeaseExpired: its driver stopped during attempt {rows[run_id]['attempts']} of "
                                         f"{attempts} (executor.retries + 1); `run --retry-failed` tries again")

    # -- the driver ----------------------------------------------------------------------------

    def _execute_plan(self) -> None:
        rows = self._recover()
        executor = self.spec.executor
        claimable = self.ledger.claimable(self.name, lease_s=executor.lease_s, max_attempts=executor.retries + 1)
        queue = [run_id for run_id in claimable if run_id in rows]
        held = sum(row["status"] == RUNNING for run_id, row in rows.items() if run_id not in queue)
        self.display = RunDisplay(len(self.scheduler.planned), self.summary.already_done, self.options.progress,
                                  self.spec.metric, self.scheduler.planned)
        self.mlflow.say = self.display.note
        self.display.note(
            f"{self.name}: {len(queue)} runs to do, {self.summary.already_done} done before"
            + (f", {held} held by other drivers" if held else "")
        )
        for line in self.notes_before:
            self.display.note(line)
        self.scheduler.enqueue(queue)
        with self.display:
            self._schedule(len(queue))

    def _schedule(self, queued: int) -> None:
        fits = capacity(self.spec, queued)
        limit = concurrency_limit(fits, self.options.max_concurrent or self.spec.executor.max_concurrent, self.options.local)
        cap = jobs_at_once(self.plan)  # verl: one job at a time when a TransferQueue store or port cannot be separated
        if cap is not None and limit > cap:
            self.display.note(f"{self.name}: {cap} run at a time, not {limit}: a verl cell's TransferQueue store or metrics "
                              "port is shared by every job on a node")
            limit = cap
        env = {"MLFLOW_TRACKING_URI": absolute_tracking_uri(self.spec.tracking.uri)}
        settings = PoolSettings.of(self.spec.executor, limit, self.keeper, env)
        listeners = (self.mlflow, self.display, CheckpointPruner(self.spec, self.scheduler.planned, self.display.note), self)
        Driver(self.scheduler, settings, self.ledger, self.host, self.cell_fn,
               DriverOptions(check_stop=self.check_stop, listeners=listeners)).run()

    def settled(self, settled: Settled | None, in_flight: int) -> None:
        """What the summary counts: runs this invocation finished, attempts that failed."""
        if settled is not None and settled.what == RECORDED:
            self.summary.finished += 1
        elif settled is not None and settled.what == FAILED_ATTEMPT:
            self.summary.failed_attempts += 1

    # -- the end -------------------------------------------------------------------------------

    def _summarise(self, rows: dict[str, dict[str, Any]], wall_s: float) -> ExperimentSummary:
        scheduler, summary = self.scheduler, self.summary
        found = Counter(row["status"] for row in rows.values())
        summary.counts = {status: found.get(status, 0) for status in (PENDING, RUNNING, DONE, FAILED)}
        summary.failures = {
            scheduler.planned[run_id].name: row["error"] or "" for run_id, row in rows.items() if row["status"] == FAILED
        }
        summary.wall_s = wall_s
        if found.get(RUNNING):  # after this driver's own runs settled: another driver's, unless its lease expired
            expired = set(Retrying(self.ledger).expired_leases(self.name, lease_s=self.spec.executor.lease_s, doing="read the leases"))
            summary.held = sum(row["status"] == RUNNING and run_id not in expired for run_id, row in rows.items())
        summary.plan = scheduler.plan
        if any(row["status"] == DONE and run_id not in scheduler.records for run_id, row in rows.items()):
            retry_transient(scheduler.read_records, "read the finished runs")  # another driver finished them meanwhile
        summary.records = [scheduler.records[run.run_id] for run in scheduler.plan.runs if run.run_id in scheduler.records]
        summary.parent_run_id = self.mlflow.parent_id
        return summary


class CheckpointPruner(RunListener):
    """A done run's checkpoints (`Backend.checkpoint_folder`: a verl run's) pruned as
    ``executor.checkpoints_when_done`` says, once its result is recorded (a failure to remove
    them is a note, not a failed run)."""

    def __init__(self, spec: ExperimentSpec, planned: dict[str, Any], note: Callable[[str], None]) -> None:
        self.spec, self.planned, self.say, self.root = spec, planned, note, run_root(spec)

    def settled(self, settled: Settled | None, in_flight: int) -> None:
        if settled is None or settled.what != RECORDED:
            return
        planned, policy = self.planned[settled.run_id], self.spec.executor.checkpoints_when_done
        folder = backend_of(planned.config).checkpoint_folder(planned.config, self.root / settled.run_id)
        if folder is None or policy == "all":
            return
        try:
            prune_checkpoints(folder, policy)
        except OSError as err:
            self.say(f"{planned.name}: its checkpoints in {folder} could not be pruned ({describe_error(err)})")
