"""The factorial design as a `Scheduler` of the one `Driver`: one `run_experiment` invocation's
ledger, MLflow (live child runs), queue of runs, and what the user watches. `executor.run_experiment`
builds one after its checks and Ray connection; the pool (`runtime.pool`) keeps every rule of a
run's life (claims, heartbeats, timeouts, kept results); this scheduler decides retries and
records outcomes."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from dapo_ablate.ablation.experiment.spec import run_root
from dapo_ablate.ablation.runtime.backends.registry import backend_of, jobs_at_once, runs_by_backend, time_limits_of
from dapo_ablate.ablation.runtime.backends.verl_checkpoints import prune_checkpoints
from dapo_ablate.ablation.runtime.driver import Driver, RunRequest
from dapo_ablate.ablation.runtime.hosts import release_orphans, this_host
from dapo_ablate.ablation.runtime.pool import DONE as DONE_OUTCOME
from dapo_ablate.ablation.runtime.pool import FAILED as FAILED_OUTCOME
from dapo_ablate.ablation.runtime.pool import (
    LOST,
    MLFLOW_RUN_ENV,
    TIMED_OUT,
    Outcome,
    PoolSettings,
    ResultKeeper,
    RunPool,
    concurrency_limit,
    record_kept,
)
from dapo_ablate.ablation.runtime.progress import EventLines
from dapo_ablate.ablation.runtime.ray_connect import capacity
from dapo_ablate.ablation.runtime.signals import INTERRUPTED_EXIT, TERMINATED_EXIT
from dapo_ablate.ablation.runtime.task import describe_error
from dapo_ablate.ablation.runtime.time_limit import TimeLimit
from dapo_ablate.ablation.store.binding import check_binding, experiment_digest
from dapo_ablate.ablation.store.database import experiment_lock
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import DONE, FAILED, PENDING, RUNNING, Ledger, connect_ledger
from dapo_ablate.ablation.store.tracking import (
    ChildRun,
    absolute_tracking_uri,
    default_artifact_location,
    flatten,
    markdown_code,
    markdown_text,
    open_tracker,
)
from dapo_ablate.ablation.store.transient import MLFLOW, Retrying, retry_transient
from dapo_ablate.core.contracts import RESULT_KEYS, metric_text

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan, PlannedRun
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec


@dataclass
class ExperimentSummary:
    """What one `run_experiment` invocation did, and where the plan's runs stand now."""

    experiment: str
    counts: dict[str, int]
    """Status -> number of the plan's runs (pending, running, done, failed)."""
    finished: int = 0
    """Runs this invocation finished."""
    failed_attempts: int = 0
    """Attempts that failed in this invocation (a run retried and then finished counts here too)."""
    already_done: int = 0
    """Runs that were done before this invocation started (skipped)."""
    interrupted: bool = False
    terminated: bool = False
    """The interruption was a SIGTERM (a scheduler's or `kill`'s stop), not Ctrl-C."""
    wall_s: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)
    """Run name -> error text of runs that are failed at the end."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """The plan's finished runs at the end, as the ledger's result records (`Ledger.results`), in
    plan order: what this invocation recorded and what was done before (read once at the start)."""
    parent_run_id: str | None = None
    """The experiment's MLflow parent run."""
    held: int = 0
    """Runs another driver holds at the end (running under its live lease): it finishes them."""
    plan: Plan | None = None
    """The plan at the end: design: adaptive, grown by every look stored (this driver's or another's)."""

    @property
    def all_done(self) -> bool:
        return self.counts.get(DONE, 0) == sum(self.counts.values())

    @property
    def exit_code(self) -> int:
        """0 when every run of the plan is done, or every run not done is held by another driver
        (it finishes them: a cooperating driver's share is done); 130 / 143 after Ctrl-C /
        SIGTERM; 1 otherwise (a run failed or is still pending)."""
        if self.interrupted:
            return TERMINATED_EXIT if self.terminated else INTERRUPTED_EXIT
        return 0 if self.counts.get(DONE, 0) + self.held == sum(self.counts.values()) else 1


@dataclass(frozen=True)
class RunOptions:
    """How one `run` invocation goes: a progress bar or plain lines, a concurrency limit over the
    spec's, failed runs given a fresh budget, and whether Ray is this machine's own (local)."""

    progress: bool = True
    max_concurrent: int | None = None
    retry_failed: bool = False
    local: bool = True


# ------------------------------------------------------------------------------- scheduler
class FactorialScheduler:
    """One invocation's state: the ledger, MLflow, the queue and the tasks in flight."""

    def __init__(self, spec: ExperimentSpec, plan: Plan, cell_fn: Callable[..., dict[str, Any]], options: RunOptions,
                 ledger: Ledger | None = None, check_stop: Callable[[], None] | None = None) -> None:
        self.spec, self.plan, self.cell_fn, self.ledger, self.local = spec, plan, cell_fn, ledger, options.local
        self.retry_failed = options.retry_failed
        self.check_stop = check_stop or (lambda: None)
        """Raises KeyboardInterrupt if Ctrl-C or SIGTERM came, even one whose own interrupt a
        library swallowed (`signals.StopSignals`); asked at every step of the loop."""
        self.name = spec.name
        self.host = this_host()
        self.planned: dict[str, PlannedRun] = {run.run_id: run for run in plan.runs}
        executor = spec.executor
        self.lease_s, self.retries = executor.lease_s, executor.retries
        self.max_concurrent = options.max_concurrent or executor.max_concurrent
        self.run_root = run_root(spec)
        self.progress = options.progress
        self.queue: deque[str] = deque()
        """Runs waiting for a slot."""
        self.budget: dict[str, int] = {}
        """Run id -> its attempts in all (across invocations)."""
        self.summary = ExperimentSummary(self.name, {})
        self.tries: Counter[str] = Counter()
        """Attempts per run made by this invocation."""
        self.display_note_later: list[str] = []
        """Lines for the display, gathered before it starts."""
        self.task_env: dict[str, dict[str, str]] = {}
        """Run id -> what its backend adds to its task's environment (`Backend.prepare`: a verl run's job)."""
        self.record: Callable[[], Any] = lambda: None
        """Records the spec in the experiment's folder (`executor.record_spec`), called once the
        ledger and MLflow have accepted it and before any store is written: a spec they refuse
        leaves the folder as it was."""
        self.live: dict[str, str] = {}
        """Ledger run id -> MLflow id of the child runs of the runs in flight."""
        self.pool: RunPool | None = None
        """The runs in flight (created when scheduling starts)."""
        self.live_off: set[str] = set()
        """Runs whose live MLflow logging stopped (the store stayed down)."""
        self.records: dict[str, dict[str, Any]] = {}
        """Run id -> the finished run's result record (`Ledger.results`' shape)."""
        self.time_limits: dict[str, TimeLimit] = {}
        """Run id -> its own time limit (`Backend.time_limits`: a verl cell's); others: executor.run_timeout_s."""

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
        rows = retry_transient(self._plan_rows, "read where the runs stand")  # the summary and headline
        if not self.summary.interrupted and all(row["status"] == DONE for row in rows.values()):
            status = "FINISHED"
        try:
            self._mlflow(lambda: self.tracker.end_parent(self.parent_id, status), "end the MLflow parent run")
        except Exception as err:  # noqa: BLE001 - e.g. a Ctrl-C cut an MLflow write and its SQLite lock
            if not self.summary.interrupted:  # lingers: the ledger holds the truth, the summary still comes
                raise
            print(f"{self.name}: the MLflow parent run was left RUNNING ({str(err).splitlines()[0][:200]})", file=sys.stderr)
        return self._summarise(rows, time.time() - started)

    def _execute_plan(self) -> None:
        rows = self._plan_rows()
        self.summary.already_done = sum(row["status"] == DONE for row in rows.values())
        self._log_unlogged_results(rows)
        if self.retry_failed:
            reset = self.ledger.reset_failed(self.name, list(rows))
            self.display_note_later.append(f"{self.name}: --retry-failed gave {reset} failed runs a fresh budget")
            rows = self._plan_rows()
        self._fail_exhausted_leases(rows)
        queue = self._queue(rows)
        budget = {run_id: self.retries + 1 for run_id in queue}  # attempts in all, across invocations
        held = sum(row["status"] == RUNNING for run_id, row in rows.items() if run_id not in queue)
        self.display = RunDisplay(len(self.planned), self.summary.already_done, self.progress)
        self.display.note(
            f"{self.name}: {len(queue)} runs to do, {self.summary.already_done} done before"
            + (f", {held} held by other drivers" if held else "")
        )
        for line in self.display_note_later:
            self.display.note(line)
        with self.display:
            self._schedule(queue, budget)

    def _summarise(self, rows: dict[str, dict[str, Any]], wall_s: float) -> ExperimentSummary:
        found = Counter(row["status"] for row in rows.values())
        self.summary.counts = {status: found.get(status, 0) for status in (PENDING, RUNNING, DONE, FAILED)}
        self.summary.failures = {
            self.planned[run_id].name: row["error"] or "" for run_id, row in rows.items() if row["status"] == FAILED
        }
        self.summary.wall_s = wall_s
        if found.get(RUNNING):  # after this driver's own runs settled: another driver's, unless its lease expired
            expired = set(Retrying(self.ledger).expired_leases(self.name, lease_s=self.lease_s, doing="read the leases"))
            self.summary.held = sum(row["status"] == RUNNING and run_id not in expired for run_id, row in rows.items())
        self.summary.plan = self.plan
        if any(row["status"] == DONE and run_id not in self.records for run_id, row in rows.items()):
            retry_transient(self._read_records, "read the finished runs")  # another driver finished them meanwhile
        self.summary.records = [self.records[run.run_id] for run in self.plan.runs if run.run_id in self.records]
        self.summary.parent_run_id = self.parent_id
        return self.summary

    # -- set-up --------------------------------------------------------------------------------

    def _open_stores(self) -> None:
        """MLflow's store is created here, once, before any task starts (docs/stores.md:
        processes creating a fresh SQLite store at once race on its schema). The ledger is opened first and
        the spec checked against the experiment its name is bound to (`store.binding`), so a
        database that is not a ledger, or another design under this name, is refused before
        anything is written; so is a run the cluster cannot place (`Backend.prepare`)."""
        for backend, runs in runs_by_backend(self.plan):
            self.task_env.update(backend.prepare(self.spec, runs))
        self.time_limits = time_limits_of(self.spec, self.plan)
        self.ledger = self.ledger or connect_ledger(self.spec.ledger)
        self.digest = experiment_digest(self.spec)
        check_binding(self.ledger.get_experiment(self.name), self.spec, self.ledger.url)
        with experiment_lock(self.spec.ledger, self.name):  # two drivers racing on a new store or parent
            self._open_stores_locked()

    def _open_stores_locked(self) -> None:
        tracking = self.spec.tracking
        location = tracking.artifact_location or default_artifact_location(tracking.uri, self.spec.output_dir)
        self.tracker = open_tracker(tracking.uri, location, self.name)
        record = self.ledger.get_experiment(self.name)
        self.tracker.check_parent(record.mlflow_parent_run_id if record else None, self.digest)
        for backend, runs in runs_by_backend(self.plan):  # e.g. verl: every node has what a verl job needs
            backend.check_nodes(self.spec, runs)
        self.record()
        self._open_ledger_experiment()
        record = self.ledger.get_experiment(self.name)
        tags = {"dapo.design": self.plan.design, "dapo.factors": ",".join(f.name for f in self.plan.factors),
                "dapo.seeds": ",".join(map(str, self.plan.seeds)), "dapo.runs": str(len(self.plan.runs))}
        if self.plan.settings:
            tags["dapo.settings"] = ",".join(self.plan.settings)
        tags["mlflow.note.content"] = parent_note(self.spec, self.plan)
        params = {"design": self.plan.design, "factors": ",".join(f.name for f in self.plan.factors),
                  "seeds": ",".join(map(str, self.plan.seeds)), "metric": self.spec.metric,
                  **{f"base.{k}": v for k, v in flatten(self.spec.trainer.to_dict()).items()}}
        self.parent_id = self.tracker.parent_run(record.mlflow_parent_run_id if record else None, name=self.name,
                                                 tags=tags, params=params, digest=self.digest)
        self.ledger.set_mlflow_parent(self.name, self.parent_id)
        self.tracker.log_dict(self.parent_id, self.spec.to_dict(), "spec.json")

    def _open_ledger_experiment(self) -> None:
        """The experiment in the ledger, bound to its digest, with its runs; the key that seals
        kept results (read now, while the database is up); what a stopped driver left: runs held
        by a dead driver on this host, results it kept on disk, results an older version stored
        unusable."""
        self.ledger.ensure_experiment(self.name, self.spec.to_dict(), digest=self.digest)
        self.keeper = ResultKeeper(self.run_root, self.ledger.result_key(self.name))
        self.ledger.add_runs(self.name, self.plan.run_specs())
        for run_id in self.ledger.reopen_malformed(self.name):
            if run_id in self.planned:
                self.display_note_later.append(f"{self.planned[run_id].name}: its stored result was unusable; it trains again")
        release_orphans(self.ledger, self.name, self.host)
        self._record_kept_results()

    def _plan_rows(self) -> dict[str, dict[str, Any]]:
        return {row["run_id"]: row for row in self.ledger.runs_table(self.name) if row["run_id"] in self.planned}

    def _log_unlogged_results(self, rows: dict[str, dict[str, Any]]) -> None:
        """The plan's finished runs are read once (the records the summary hands on); those without
        a finished MLflow child (a driver died between the two writes, or another experiment
        trained the shared run) are logged now."""
        self._read_records()
        logged = self.tracker.finished_children(self.parent_id)
        for run_id, record in self.records.items():
            if rows[run_id]["status"] == DONE and run_id not in logged:
                self._log_child(run_id, record, record["mlflow_run_id"] is None)

    def _read_records(self) -> None:
        self.records.update((r["run_id"], r) for r in self.ledger.results(self.name) if r["run_id"] in self.planned)

    def _queue(self, rows: dict[str, dict[str, Any]]) -> deque[str]:
        claimable = self.ledger.claimable(self.name, lease_s=self.lease_s, max_attempts=self.retries + 1)
        return deque(run_id for run_id in claimable if run_id in rows)

    def _fail_exhausted_leases(self, rows: dict[str, dict[str, Any]]) -> None:
        """A run whose lease expired after its last allowed attempt (its drivers kept dying with
        it) is failed with that reason instead of being claimed forever."""
        expired = self.ledger.expired_leases(self.name, lease_s=self.lease_s)
        for run_id in expired:
            if run_id in rows and rows[run_id]["attempts"] >= self.retries + 1:
                self.ledger.fail(run_id, f"LeaseExpired: its driver stopped during attempt {rows[run_id]['attempts']} of "
                                         f"{self.retries + 1} (executor.retries + 1); `run --retry-failed` tries again")

    # -- scheduling ----------------------------------------------------------------------------

    def _schedule(self, queue: deque[str], budget: dict[str, int]) -> None:
        self.queue, self.budget = queue, budget
        fits = capacity(self.spec, len(queue))
        limit = concurrency_limit(fits, self.max_concurrent, self.local)
        cap = jobs_at_once(self.plan)  # verl: one job per Ray cluster (TransferQueue's controller)
        if cap is not None and limit > cap:
            self.display.note(f"{self.name}: {cap} run at a time, not {limit}: verl jobs on one Ray cluster share TransferQueue's controller")
            limit = cap
        env = {"MLFLOW_TRACKING_URI": absolute_tracking_uri(self.spec.tracking.uri)}
        settings = PoolSettings.of(self.spec.executor, limit, self.keeper, env)
        Driver(self, settings, self.ledger, self.host, self.cell_fn, check_stop=self.check_stop).run()

    # -- the Scheduler protocol (runtime.driver) -----------------------------------------------

    def start(self, pool: RunPool) -> None:
        self.pool = pool

    def next_run(self) -> RunRequest | None:
        if not self.queue:
            return None
        run_id = self.queue.popleft()
        planned = self.planned[run_id]
        return RunRequest(run_id, planned.config.to_dict(), self.budget[run_id],
                          resources=backend_of(planned.config).task_resources,
                          prepare=lambda: self._start_child(run_id), time_limit=self.time_limits.get(run_id))

    def submitted(self, request: RunRequest, accepted: bool) -> None:
        if accepted:
            self.tries[request.run_id] += 1
        self.display.update(running=len(self.pool))

    def on_outcome(self, outcome: Outcome) -> None:
        self._settle(outcome, self.queue)
        self.display.update(running=len(self.pool))

    def on_tick(self) -> None:
        """Nothing of its own: the pool heartbeats the leases."""

    def finished(self) -> bool:
        return not self.queue

    def run_name(self, run_id: str) -> str:
        return self.planned[run_id].name

    def _start_child(self, run_id: str) -> dict[str, str]:
        """The run's MLflow child, RUNNING, before its task starts; the task's environment names
        it (a verl job logs into it) and holds what its backend prepared (a verl run's job as the dry run printed it)."""
        self.live[run_id] = self._mlflow(lambda: self.tracker.start_child(self.parent_id, self._child_run(run_id, {})),
                                         f"start the MLflow run of {self.planned[run_id].name}")
        return {MLFLOW_RUN_ENV: self.live[run_id], **self.task_env.get(run_id, {})}

    def _settle(self, outcome: Outcome, queue: deque[str]) -> None:
        """Record what became of one run in flight."""
        run_id, name = outcome.run_id, self.planned[outcome.run_id].name
        if outcome.kind == DONE_OUTCOME:
            self._collect(run_id, outcome.result or {})
        elif outcome.kind in (FAILED_OUTCOME, TIMED_OUT):  # the run's failure, not the driver's: record it and go on
            if outcome.kind == FAILED_OUTCOME:  # (a timed-out one: failed in the ledger by the pool)
                self.pool.fail(run_id, outcome.error)
            self._end_child(run_id, "FAILED")
            self.summary.failed_attempts += 1
            backend = backend_of(self.planned[run_id].config)
            retry = self.tries[run_id] <= self.retries and backend.retries(outcome.error, outcome.kind == TIMED_OUT)
            if retry:
                queue.append(run_id)
            self.display.failed(name, outcome.error, self.tries[run_id], retry)
        elif outcome.kind == LOST:  # the taker continues its MLflow child
            self.live.pop(run_id, None)
            self.display.note(f"{name}: lease lost to another driver; stopped here")

    def _collect(self, run_id: str, result: dict[str, Any]) -> None:
        """Record one finished run: the ledger (kept on disk first), then its MLflow child."""
        planned = self.planned[run_id]
        try:
            recorded = self.pool.record(run_id, result)
        except ExecutorError:  # the database stays down: the driver stops, the result is kept
            raise
        except (ValueError, TypeError) as err:  # a result the ledger cannot hold: retraining gives it again
            error = f"the run finished but its result cannot be stored: {describe_error(err)}"
            self.pool.fail(run_id, error)
            self._end_child(run_id, "FAILED")
            self.summary.failed_attempts += 1
            self.display.failed(planned.name, error, self.tries[run_id], retry=False)
            return
        if not recorded:  # done meanwhile by another driver
            self.live.pop(run_id, None)
            self.display.note(f"{planned.name}: already done by another driver")
            return
        self._log_child(run_id, result, set_ledger=True)
        self.records[run_id] = {"run_id": run_id, "cell_key": planned.cell.key, "factors": dict(planned.factors),
                                "seed": planned.seed, **{key: result.get(key) for key in RESULT_KEYS}, "mlflow_run_id": None}
        self.summary.finished += 1
        self.display.done(planned.name, result, self.spec.metric)
        self._prune_checkpoints(run_id)

    def _prune_checkpoints(self, run_id: str) -> None:
        """A done run's checkpoints (`Backend.checkpoint_folder`: a verl run's) as
        ``executor.checkpoints_when_done`` says (its result is recorded: a failure to remove them is a
        note, not a failed run)."""
        planned, policy = self.planned[run_id], self.spec.executor.checkpoints_when_done
        folder = backend_of(planned.config).checkpoint_folder(planned.config, self.run_root / run_id)
        if folder is None or policy == "all":
            return
        try:
            prune_checkpoints(folder, policy)
        except OSError as err:
            self.display.note(f"{planned.name}: its checkpoints in {folder} could not be pruned ({describe_error(err)})")

    # -- a finished result is never trained twice ----------------------------------------------

    def _record_kept_results(self) -> None:
        """Results kept on disk by a driver whose ledger write failed are recorded now; a kept
        file this product did not seal for its run is set aside (the run trains)."""
        rows = self._plan_rows()
        undone = [run_id for run_id, row in rows.items() if row["status"] != DONE]
        kept = record_kept(self.ledger, self.keeper, undone, lambda run_id: self.planned[run_id].name, self.host)
        for run_id in kept.recorded:
            self.display_note_later.append(f"{self.planned[run_id].name}: recorded its kept result (not retrained)")
        self.display_note_later.extend(kept.notes)

    # -- MLflow --------------------------------------------------------------------------------

    def _mlflow(self, write, doing: str) -> Any:
        """An MLflow write, retried through the store's blips."""
        return retry_transient(write, doing, store=MLFLOW)

    def _log_child(self, run_id: str, result: dict[str, Any], set_ledger: bool) -> None:
        live_id = self.live.pop(run_id, None)
        child = self._child_run(run_id, result)
        if backend_of(self.planned[run_id].config).job_from_driver and live_id is not None:
            # the job (verl's) logged its metrics into this very run: it is finished, not logged a second time
            self._mlflow(lambda: self.tracker.end_child(live_id, "FINISHED"), f"finish the MLflow run of {child.name}")
            mlflow_id = live_id
        else:
            mlflow_id = self._mlflow(lambda: self.tracker.log_child(self.parent_id, child), f"log {child.name} to MLflow")
        if set_ledger:
            Retrying(self.ledger).set_mlflow_run(run_id, mlflow_id, doing=f"record the MLflow run of {child.name}")

    def on_event(self, run_id: str, kind: str, step: int, data: dict[str, Any]) -> None:
        """A run's training step or evaluation, logged to its MLflow child while it trains. Best
        effort: when the store stays down, live logging stops for that run with a note (the
        result is logged in full when the run finishes); the runs go on."""
        if kind == "note" and run_id in self.planned:  # e.g. a checkpoint it would not trust
            self.display.note(f"{self.planned[run_id].name}: {data.get('message')}")
        if run_id in self.live and kind in ("step", "eval") and run_id not in self.live_off:
            mlflow_id = self.live[run_id]
            try:
                self._mlflow(lambda: self.tracker.log_event(mlflow_id, kind, step, data),
                             f"log {self.planned[run_id].name}'s {kind} {step} to MLflow")
            except ExecutorError as err:
                self.live_off.add(run_id)
                self.display.note(f"{self.planned[run_id].name}: live MLflow logging stopped ({err})")

    def _end_child(self, run_id: str, status: str) -> None:
        """A run in flight stopped without a result: its child run shows FAILED or KILLED."""
        mlflow_id = self.live.pop(run_id, None)
        if mlflow_id is not None:
            self._mlflow(lambda: self.tracker.end_child(mlflow_id, status), f"end the MLflow run of {self.planned[run_id].name}")

    def _child_run(self, run_id: str, result: dict[str, Any]) -> ChildRun:
        planned = self.planned[run_id]
        tags = {
            "dapo.design": self.plan.design,
            "dapo.cell": planned.cell.key,
            "dapo.cell_label": self.plan.label(planned.cell),
            "dapo.orderings": ",".join(self.plan.orderings_through(planned.cell)),
            "dapo.experiment": self.name,
        } | ({"dapo.setting": planned.setting} if planned.setting else {})
        return ChildRun(run_id, planned.name, dict(planned.factors), planned.seed, planned.config.to_dict(), result, tags)

    def abandon(self, released: list[str]) -> None:
        """Ctrl-C, SIGTERM or a driver error: the runs in flight went back to pending (their Ray
        jobs, if any, keep running for the next invocation) and their children show KILLED."""
        for run_id in released:
            mlflow_id = self.live.pop(run_id, None)
            try:
                if mlflow_id is not None:
                    self.tracker.end_child(mlflow_id, "KILLED")  # continued by the next invocation
            except Exception:  # noqa: BLE001 - the store may be what failed; the ledger is what counts
                pass


class RunDisplay(EventLines):
    """What the user watches: a rich progress bar (done, running, failed, ETA) with one line
    per finished or failed run above it, or just those lines (``enabled=False``)."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        super().__init__(enabled)
        self.total, self.n_done = total, done
        self.running = self.n_failed = self.finished_now = 0
        self.started = time.monotonic()

    def __enter__(self) -> RunDisplay:
        if self.enabled:
            self._start_bar("runs", self.total, completed=self.n_done, eta=True)
            self._refresh()
        return self

    def update(self, running: int) -> None:
        self.running = running
        self._refresh()

    def done(self, name: str, result: dict[str, Any], metric: str) -> None:
        self.n_done += 1
        self.finished_now += 1
        value = (result.get("metrics") or {}).get(metric)
        shown = metric_text(value, metric)
        self._line(f"done    {name:<28} {shown}  {float(result.get('wall_s') or 0):.1f} s")

    def grow(self, runs: int) -> None:
        """An adaptive experiment's look added `runs` runs to the plan."""
        self.total += runs
        if self.bar is not None:
            self.bar.update(self.task, total=self.total)
        self._refresh()

    def failed(self, name: str, error: str, attempt: int, retry: bool) -> None:
        if not retry:
            self.n_failed += 1
        then = "retrying" if retry else "giving up for now"
        self._line(f"failed  {name:<28} attempt {attempt}, {then}: {error}")

    def eta(self) -> str:
        """Remaining runs at this invocation's throughput so far."""
        remaining = self.total - self.n_done - self.n_failed
        if self.finished_now == 0 or remaining <= 0:
            return "ETA -:--" if remaining > 0 else ""
        seconds = int(remaining * (time.monotonic() - self.started) / self.finished_now)
        return f"ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def _refresh(self) -> None:
        if self.bar is not None:
            state = f"done {self.n_done}  running {self.running}  failed {self.n_failed}"
            self.bar.update(self.task, completed=self.n_done, state=state, eta=self.eta())


def parent_note(spec: ExperimentSpec, plan: Plan) -> str:
    """The MLflow parent's description: design, factors, seeds, runs, metric (and settings). MLflow
    renders it as Markdown: every name in it is escaped (`markdown_code`, `markdown_text`)."""
    lines = [
        f"Ablation {markdown_code(spec.name)}: {plan.design} design over {len(plan.factors)} factors "
        f"({', '.join(markdown_text(f.name) for f in plan.factors)}), {len(plan.cells)} cells x seeds "
        f"{', '.join(map(str, plan.seeds))} = {len(plan.runs)} runs; metric {markdown_text(spec.metric)}.",
    ]
    lines += [f"- {markdown_text(line)}" for line in plan.supports]
    if plan.settings:
        lines += ["", settings_note(spec)]
    return "\n".join(lines)


def settings_note(spec: ExperimentSpec) -> str:
    """The MLflow parent's description of a transfer study: one line per setting and its overrides."""
    lines = [f"Transfer study over {len(spec.settings)} settings (the design runs in each):"]
    lines += [f"- {markdown_text(s.name)}: {markdown_code(json.dumps(s.overrides, sort_keys=True))}" for s in spec.settings]
    return "\n".join(lines)
