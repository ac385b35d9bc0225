"""The factorial design as a `Scheduler` of the one `Driver`: the queue of the plan's runs, their
attempt budgets and retries, and what each outcome changes (its result recorded, its failure
recorded and retried or given up). The pool (`runtime.pool`) keeps every rule of a run's life
(claims, heartbeats, timeouts, kept results); the experiment's owner (`runtime.experiment_run`)
opens the stores, recovers what a stopped driver left, builds the driver with its listeners
(the display, MLflow) and ends the experiment. This module imports neither MLflow nor the
display: it tells what it decided (`driver.Settled`, `Listeners.note`)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.runtime.backends.registry import backend_of
from dapo_ablate.ablation.runtime.driver import (
    DONE_ELSEWHERE,
    FAILED_ATTEMPT,
    LEASE_LOST,
    RECORDED,
    Listeners,
    RunRequest,
    Settled,
)
from dapo_ablate.ablation.runtime.pool import DONE as DONE_OUTCOME
from dapo_ablate.ablation.runtime.pool import FAILED as FAILED_OUTCOME
from dapo_ablate.ablation.runtime.pool import LOST, TIMED_OUT, Outcome, RunPool
from dapo_ablate.ablation.runtime.signals import INTERRUPTED_EXIT, TERMINATED_EXIT
from dapo_ablate.ablation.runtime.task import describe_error
from dapo_ablate.ablation.runtime.time_limit import TimeLimit
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import DONE, Ledger
from dapo_ablate.core.contracts import RESULT_KEYS

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
    """The plan's runs: a queue, each run's attempts (this invocation's and its budget in all),
    the records of the finished ones (see the module docstring)."""

    def __init__(self, spec: ExperimentSpec, plan: Plan, ledger: Ledger) -> None:
        self.spec, self.plan, self.ledger, self.name = spec, plan, ledger, spec.name
        self.planned: dict[str, PlannedRun] = {run.run_id: run for run in plan.runs}
        self.lease_s, self.retries = spec.executor.lease_s, spec.executor.retries
        self.queue: deque[str] = deque()
        """Runs waiting for a slot."""
        self.budget: dict[str, int] = {}
        """Run id -> its attempts in all (across invocations)."""
        self.tries: Counter[str] = Counter()
        """Attempts per run made by this invocation."""
        self.task_env: dict[str, dict[str, str]] = {}
        """Run id -> what its backend adds to its task's environment (`Backend.prepare`: a verl run's job)."""
        self.time_limits: dict[str, TimeLimit] = {}
        """Run id -> its own time limit (`Backend.time_limits`: a verl cell's); others: executor.run_timeout_s."""
        self.records: dict[str, dict[str, Any]] = {}
        """Run id -> the finished run's result record (`Ledger.results`' shape)."""
        self.pool: RunPool | None = None
        """The runs in flight (set when the driver starts)."""
        self.listeners = Listeners([])
        """Whom the scheduler tells its notes (set when the driver starts)."""

    def enqueue(self, run_ids: list[str]) -> None:
        """Queue `run_ids` (claimable now), each with a fresh budget of executor.retries + 1
        attempts in all, across invocations."""
        for run_id in run_ids:
            self.queue.append(run_id)
            self.budget[run_id] = self.retries + 1

    def plan_rows(self) -> dict[str, dict[str, Any]]:
        """The ledger's rows of the plan's runs (`Ledger.runs_table`)."""
        return {row["run_id"]: row for row in self.ledger.runs_table(self.name) if row["run_id"] in self.planned}

    def read_records(self) -> None:
        """The plan's finished runs' records, as the ledger holds them now."""
        self.records.update((r["run_id"], r) for r in self.ledger.results(self.name) if r["run_id"] in self.planned)

    # -- the Scheduler protocol (runtime.driver) -----------------------------------------------

    def start(self, pool: RunPool, listeners: Listeners) -> None:
        self.pool, self.listeners = pool, listeners

    def next_run(self) -> RunRequest | None:
        if not self.queue:
            return None
        run_id = self.queue.popleft()
        planned = self.planned[run_id]
        return RunRequest(run_id, planned.config.to_dict(), self.budget[run_id],
                          resources=backend_of(planned.config).task_resources,
                          prepare=lambda: dict(self.task_env.get(run_id, {})), time_limit=self.time_limits.get(run_id),
                          name=planned.name)

    def submitted(self, request: RunRequest, accepted: bool) -> None:
        if accepted:
            self.tries[request.run_id] += 1

    def on_outcome(self, outcome: Outcome) -> Settled:
        """Record what became of one run in flight, and say so."""
        run_id, name = outcome.run_id, self.planned[outcome.run_id].name
        if outcome.kind == DONE_OUTCOME:
            return self._collect(run_id, outcome.result or {})
        if outcome.kind in (FAILED_OUTCOME, TIMED_OUT):  # the run's failure, not the driver's: record it and go on
            if outcome.kind == FAILED_OUTCOME:  # (a timed-out one: failed in the ledger by the pool)
                self.pool.fail(run_id, outcome.error)
            backend = backend_of(self.planned[run_id].config)
            retry = self.tries[run_id] <= self.retries and backend.retries(outcome.error, outcome.kind == TIMED_OUT)
            if retry:
                self.queue.append(run_id)
            return Settled(run_id, name, FAILED_ATTEMPT, error=outcome.error, attempt=self.tries[run_id], retry=retry)
        if outcome.kind == LOST:  # the taker continues the run
            return Settled(run_id, name, LEASE_LOST)
        raise ValueError(f"an outcome of an unknown kind: {outcome.kind!r}")

    def on_tick(self) -> None:
        """Nothing of its own: the pool heartbeats the leases."""

    def finished(self) -> bool:
        return not self.queue

    def _collect(self, run_id: str, result: dict[str, Any]) -> Settled:
        """Record one finished run in the ledger (kept on disk first)."""
        planned = self.planned[run_id]
        try:
            recorded = self.pool.record(run_id, result)
        except ExecutorError:  # the database stays down: the driver stops, the result is kept
            raise
        except (ValueError, TypeError) as err:  # a result the ledger cannot hold: retraining gives it again
            error = f"the run finished but its result cannot be stored: {describe_error(err)}"
            self.pool.fail(run_id, error)
            return Settled(run_id, planned.name, FAILED_ATTEMPT, error=error, attempt=self.tries[run_id], retry=False)
        if not recorded:  # done meanwhile by another driver
            return Settled(run_id, planned.name, DONE_ELSEWHERE)
        self.records[run_id] = {"run_id": run_id, "cell_key": planned.cell.key, "factors": dict(planned.factors),
                                "seed": planned.seed, **{key: result.get(key) for key in RESULT_KEYS}, "mlflow_run_id": None}
        return Settled(run_id, planned.name, RECORDED, result=result)
