"""The one pool of runs in flight on Ray, which the one `Driver` (`runtime.driver`) runs for every
scheduler (a factorial's, a sweep's), so that every rule of a run's life is written once:

- **submit**: claim the run in the ledger (a lease for this driver), start its Ray task with the
  executor's CPUs/GPUs, at most `limit` at a time (a local Ray: what fits on this machine);
- **events**: a task's training steps, evaluations and job ids reach the driver through one Ray
  queue; a job id is written to the ledger here, every event is handed to the driver's
  ``on_event`` (MLflow live children, a sweep's pruner);
- **heartbeats**: every ``beat_s`` the leases of the runs in flight are renewed; a run whose lease
  was taken over by another driver is cancelled here (`LOST`);
- **timeouts**: a run past its time limit (``executor.run_timeout_s``, or the one its scheduler
  asks for: a verl cell's from its estimate, `time_limit.TimeLimit`) is cancelled, recorded failed
  with that reason and its slot freed (`TIMED_OUT`; the scheduler decides whether it is retried);
  its time counts from its task's start on a Ray worker (the task's `STARTED` event), and for a run
  that is a Ray job from the job's submission (its "job" event), not from the driver's submit: a
  loaded machine's slow worker start-up is not the run's time;
- **results**: a finished run's result is kept on disk, sealed with the experiment's key
  (`store.kept_results`), before the ledger write, which is retried through database blips; a
  result kept by a driver that died (or whose database stayed down) is recorded by the next
  invocation instead of training the run again, and a kept file this product did not seal for
  that run is set aside (the run trains); every task gets the experiment's worker key
  (`worker_key`, in ``$DAPO_ABLATE_SEAL_KEY``), which seals its checkpoints and cached evaluations;
- **cancel**: a pruned trial's runs (or a timed-out one) are cancelled and their Ray jobs stopped;
  Ctrl-C gives every run in flight back to pending (`abandon`) and leaves jobs running, so that a
  rerun re-attaches to them.

Every ledger write goes through `transient.retry_transient`. Only the driver that owns the pool
writes the ledger; a task only trains and sends events.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from dapo_ablate.ablation.experiment.spec import EVAL_CACHE_FOLDER
from dapo_ablate.ablation.runtime.jobs import SEAL_ENV
from dapo_ablate.ablation.runtime.jobs import stop_job as stop_ray_job
from dapo_ablate.ablation.runtime.task import STARTED, describe_error, execute_run
from dapo_ablate.ablation.runtime.time_limit import TimeLimit
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.kept_results import KEPT_RESULT, KeptRecords, ResultKeeper, record_result
from dapo_ablate.ablation.store.ledger import Ledger
from dapo_ablate.ablation.store.transient import Retrying
from dapo_ablate.core import seals

__all__ = ["KEPT_RESULT", "KeptRecords", "Outcome", "PoolSettings", "ResultKeeper", "RunPool", "concurrency_limit",
           "live_queue", "record_result"]

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.spec import ExecutorSpec

DONE, FAILED, TIMED_OUT, LOST = "done", "failed", "timed_out", "lost"
LIVE_POLL_S = 1.0
"""How often the pool hands the runs' live events to the driver (at most this many seconds late)."""
LIVE_QUEUE_SIZE = 100_000
MLFLOW_RUN_ENV = "DAPO_ABLATE_MLFLOW_RUN_ID"
"""In a task's environment: the MLflow child run of its run (a verl job logs into it)."""


@dataclass
class Outcome:
    """What became of one run in flight: DONE (its `result`), FAILED (its `error`; the ledger is
    not written yet, the driver decides about a retry), TIMED_OUT (failed in the ledger with that
    reason) or LOST (its lease went to another driver; cancelled here)."""

    run_id: str
    kind: str
    result: dict[str, Any] | None = None
    error: str = ""


@dataclass(frozen=True)
class PoolSettings:
    """How a pool runs its tasks: each task's Ray resources, at most `limit` at a time, leases of
    `lease_s`, cancelled after `timeout_s`, in folders under `run_root` (and the shared step-0
    evaluation cache), with `env` in every task's environment; finished results are kept sealed
    with `result_key` (`Ledger.result_key` of the experiment, read while the database is up)."""

    resources: dict[str, float]
    limit: int
    lease_s: float
    timeout_s: float | None
    run_root: Path
    eval_cache: Path
    result_key: bytes = field(repr=False)
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, executor: ExecutorSpec, limit: int, keeper: ResultKeeper, env: dict[str, str] | None = None) -> PoolSettings:
        """The executor section's settings, run folders and key of `keeper`; the evaluation cache
        sits beside the run folders."""
        run_root = keeper.run_root
        return cls({"num_cpus": executor.cpus_per_run, "num_gpus": executor.gpus_per_run}, limit, executor.lease_s,
                   executor.run_timeout_s, run_root, run_root.parent / EVAL_CACHE_FOLDER, keeper.key, dict(env or {}))

    @property
    def keeper(self) -> ResultKeeper:
        return ResultKeeper(self.run_root, self.result_key)


def worker_key(result_key: bytes) -> bytes:
    """The key a run's task seals its checkpoints and cached evaluations with (`core.seals`),
    derived from the experiment's `result_key` (which never leaves the driver)."""
    return seals.derive(result_key, "worker")


def concurrency_limit(fits: int, max_concurrent: int | None, local: bool) -> int:
    """Runs in flight at once. A local Ray cannot run more than `fits` (more would wait in Ray's
    queue while the ledger calls them running); a cluster may autoscale, so its limit is taken as
    given."""
    return min(max_concurrent or fits, fits) if local else (max_concurrent or fits)


@dataclass
class _InFlight:
    run_id: str
    ref: Any
    deadline: float
    limit: TimeLimit
    job_id: str | None = None

    def restart_clock(self) -> None:
        """The run's time counts from now (its task's start, its job's submission)."""
        self.deadline = self.limit.deadline(time.monotonic())


class RunPool:
    """The runs one driver has in flight on Ray (see the module docstring)."""

    def __init__(self, ledger: Ledger, host: str, cell_fn: Callable[..., dict[str, Any]], settings: PoolSettings, *,
                 names: Callable[[str], str] = str,
                 on_event: Callable[[str, str, int, dict[str, Any]], None] | None = None) -> None:
        import ray

        self.ledger, self.host, self.cell_fn = ledger, host, cell_fn
        self.stored = Retrying(ledger)
        """The ledger, each write retried through its blips."""
        self.resources, self.limit = settings.resources, max(1, settings.limit)
        self.lease_s, self.timeout_s = settings.lease_s, settings.timeout_s
        self.beat_s = min(self.lease_s / 4, 30.0)
        self.run_root, self.eval_cache = settings.run_root, settings.eval_cache
        self.keeper = settings.keeper
        self.names, self.on_event = names, on_event
        self.env = {**settings.env, SEAL_ENV: worker_key(settings.result_key).hex()}
        self.task = ray.remote(execute_run)
        self.events = live_queue()
        self._next_event: Any = None
        """A pending get on the events queue: `poll` wakes up as soon as an event arrives (a pruner
        acts on an evaluation at once), not only when a run finishes or the poll interval ends."""
        self.flights: dict[str, _InFlight] = {}
        """Run id -> its task in flight."""
        self.unsettled: set[str] = set()
        """Runs whose task ended and whose outcome the driver has not recorded yet."""
        self.last_beat = time.monotonic()

    # -- state ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.flights)

    def __contains__(self, run_id: str) -> bool:
        return run_id in self.flights

    def free(self) -> int:
        """Slots free now."""
        return self.limit - len(self.flights)

    # -- submit --------------------------------------------------------------------------------

    def submit(self, run_id: str, config: dict[str, Any], *, max_attempts: int,
               prepare: Callable[[], dict[str, str]] | None = None, resources: dict[str, float] | None = None,
               time_limit: TimeLimit | None = None) -> bool:
        """Claim `run_id` and start its task; False if the ledger would not give it (done, held by
        another driver, or out of attempts). `prepare()`, called once the run is claimed and
        before its task starts (the factorial driver creates its MLflow child there), returns
        extra environment for the task; if it raises, the claim is given back. `resources`: the
        task's own instead of the pool's (a task that only submits a Ray job holds none).
        `time_limit`: the run's own instead of ``executor.run_timeout_s`` (a verl cell's)."""
        claimed = self.stored.claim(run_id, self.host, lease_s=self.lease_s, max_attempts=max_attempts,
                                    doing=f"claim {self.names(run_id)}")
        if not claimed:
            return False
        try:
            env = {**self.env, **(prepare() if prepare is not None else {})}
        except BaseException:
            self.ledger.release(run_id, self.host)
            raise
        ref = self.task.options(max_retries=0, **(self.resources if resources is None else resources)).remote(
            self.cell_fn, config, str(self.run_root / run_id), str(self.eval_cache), self.events, run_id, env,
        )
        flight = _InFlight(run_id, ref, math.inf, time_limit or TimeLimit(self.timeout_s))
        if self.events is None:  # the task's start is never heard of: the time counts from here
            flight.restart_clock()
        self.flights[run_id] = flight
        return True

    # -- the loop's step -----------------------------------------------------------------------

    def poll(self, max_wait_s: float | None = None) -> list[Outcome]:
        """Wait until a run finishes, an event is due, a heartbeat or a deadline comes (at most
        `max_wait_s`); hand the events over; return what became of runs meanwhile."""
        import ray

        if not self.flights:
            if max_wait_s:
                time.sleep(max_wait_s)
            return []  # (a pending get on the queue stays armed for the next run's events)
        now = time.monotonic()
        waits = [self.beat_s - (now - self.last_beat), LIVE_POLL_S, *(f.deadline - now for f in self.flights.values())]
        if max_wait_s is not None:
            waits.append(max_wait_s)
        refs = {flight.ref: run_id for run_id, flight in self.flights.items()}
        if self.events is not None and self._next_event is None:
            self._next_event = self.events.actor.get.remote(None)
        waiting = list(refs) + ([self._next_event] if self._next_event is not None else [])
        ray.wait(waiting, num_returns=1, timeout=max(0.05, min(waits)))
        first = []
        # (asked again, not taken from ray.wait's answer: with a run's result also ready, it may
        # have returned only that. An event still on its way after its run's result is dropped:
        # the result holds the whole curve, and the drivers log what the events did not.)
        if self._next_event is not None and ray.wait([self._next_event], timeout=0)[0]:
            try:
                first = [ray.get(self._next_event)]
            except Exception:  # noqa: BLE001 - the queue's actor died: results still come
                self._lost_events()
            self._next_event = None
        self.drain_events(first)  # first: a finished task's events are all queued before its result
        # every run finished by now (not only the one ray.wait woke up for), before heartbeats
        # and deadlines judge the rest: a finished run is never timed out or given up as lost
        finished = ray.wait(list(refs), num_returns=len(refs), timeout=0)[0]
        outcomes = [self._collect(refs[ref]) for ref in finished if self._is_flight(refs[ref], ref)]
        if time.monotonic() - self.last_beat >= self.beat_s:
            outcomes += self._heartbeat()
            self.last_beat = time.monotonic()
        return outcomes + self._time_out()

    def _is_flight(self, run_id: str, ref: Any) -> bool:
        flight = self.flights.get(run_id)
        return flight is not None and flight.ref is ref  # else cancelled meanwhile (a prune, a lost lease)

    def _collect(self, run_id: str) -> Outcome:
        """A finished task's outcome; its result is kept on disk at once, so that a driver stopped
        before recording it (Ctrl-C, a store that stays down) never has it trained again. Until
        the driver records or fails it, the run is `unsettled` (given back by `abandon`)."""
        import ray

        flight = self.flights.pop(run_id)
        self.unsettled.add(run_id)
        try:
            result = ray.get(flight.ref)
        except Exception as err:  # the run's failure, not the driver's: the driver records it
            return Outcome(run_id, FAILED, error=describe_error(err))
        self.keeper.keep(run_id, result)
        return Outcome(run_id, DONE, result=result)

    def drain_events(self, first: list[tuple] | None = None) -> None:
        """Hand the events the runs in flight sent since the last call (`first`: the one the
        pending get received) to ``on_event``; a job id is written to the ledger first (a rerun
        re-attaches to that job)."""
        batch = list(first or [])
        if self.events is not None:
            try:
                waiting = self.events.qsize()
                batch += self.events.get_nowait_batch(waiting) if waiting else []
            except Exception:  # noqa: BLE001 - the queue's actor died with a crashed Ray: results still come
                pass
        for run_id, kind, step, data in batch:
            flight = self.flights.get(run_id)
            if flight is None:
                continue  # a run cancelled meanwhile: its late events are not its child's any more
            if kind == STARTED:
                flight.restart_clock()
                continue
            if kind == "job":
                self._record_job(flight, str(data.get("submission_id") or ""))
            if self.on_event is not None:
                self.on_event(run_id, kind, step, data)

    def _lost_events(self) -> None:
        """The queue's actor died: starts are no longer heard of, so a run still waiting for its
        start event has its time counted from now."""
        self.events = None
        for flight in self.flights.values():
            if flight.deadline == math.inf:
                flight.restart_clock()

    def _record_job(self, flight: _InFlight, job_id: str) -> None:
        if not job_id or job_id == flight.job_id:
            return
        flight.job_id = job_id
        flight.restart_clock()  # a job's time counts from its submission (or re-attachment)
        self.stored.set_job_id(flight.run_id, job_id, doing=f"record the job of {self.names(flight.run_id)}")

    def _heartbeat(self) -> list[Outcome]:
        """Renew the leases of the runs in flight; a run whose lease was lost (taken over by
        another driver after a long stall) is cancelled, and its result left to the taker."""
        lost = []
        for run_id in list(self.flights):
            held = self.stored.heartbeat(run_id, self.host, doing=f"renew the lease of {self.names(run_id)}")
            if not held:  # its job (if any) is the taker's now: it re-attaches to it, so it keeps running
                self.cancel(run_id, release=False, stop_job=False)
                lost.append(Outcome(run_id, LOST, error="its lease was taken over by another driver"))
        return lost

    def _time_out(self) -> list[Outcome]:
        """Cancel the runs past their time limit (and stop their jobs) and record them failed; the
        scheduler decides about a retry."""
        now = time.monotonic()
        outcomes = []
        for run_id in [run_id for run_id, flight in self.flights.items() if flight.deadline <= now]:
            error = self.flights[run_id].limit.error()
            self.cancel(run_id, release=False)
            self.fail(run_id, error)
            outcomes.append(Outcome(run_id, TIMED_OUT, error=error))
        return outcomes

    # -- ledger writes ---------------------------------------------------------------------------

    def fail(self, run_id: str, error: str) -> None:
        self.stored.fail(run_id, error, self.host, doing=f"record the failure of {self.names(run_id)}")
        self.unsettled.discard(run_id)

    def record(self, run_id: str, result: dict[str, Any]) -> bool:
        """`record_result` for a run of this pool. False if another driver had finished it;
        ValueError / TypeError for a result the ledger cannot hold (its kept file is dropped:
        the driver fails the run)."""
        recorded = record_result(self.ledger, self.keeper, run_id, result, self.names(run_id))
        self.unsettled.discard(run_id)
        return recorded

    # -- stopping --------------------------------------------------------------------------------

    def cancel(self, run_id: str, *, release: bool = True, stop_job: bool = True) -> None:
        """Stop one run in flight: its Ray task and (`stop_job`) its Ray job; `release` gives it
        back to pending in the ledger (a pruned trial's run) -- unless it has finished meanwhile,
        then its result is recorded instead: a finished run is never paid for twice. The caller
        records anything else."""
        import ray

        flight = self.flights.pop(run_id, None)
        if flight is None:
            return
        if release:  # first: Ctrl-C may have stopped Ray itself
            if not self._record_if_finished(flight):
                self.stored.release(run_id, self.host, doing=f"give back {self.names(run_id)}")
        try:
            ray.cancel(flight.ref, force=True)
        except Exception:  # noqa: BLE001 - a Ray stopped by Ctrl-C has nothing left to cancel
            pass
        if stop_job and flight.job_id:
            try:
                stop_ray_job(flight.job_id)
            except Exception:  # noqa: BLE001 - the job's failure is recorded by its next attempt
                pass

    def _record_if_finished(self, flight: _InFlight) -> bool:
        """True if the run had finished with a result, now recorded."""
        import ray

        try:
            if not ray.wait([flight.ref], timeout=0)[0]:
                return False
            result = ray.get(flight.ref)
        except Exception:  # noqa: BLE001 - failed, or Ray is gone: given back like a run in flight
            return False
        try:
            self.keeper.keep(flight.run_id, result)
            record_result(self.ledger, self.keeper, flight.run_id, result, self.names(flight.run_id))
        except ExecutorError:
            raise
        except (ValueError, TypeError):
            return False
        return True

    def abandon(self) -> list[str]:
        """Ctrl-C, SIGTERM or a driver error: give every run in flight, and every run whose outcome
        was not recorded yet, back to pending and cancel its task; its Ray job (if any) keeps
        running for the next invocation to re-attach to, and a result kept on disk is recorded
        by the next invocation. The runs given back."""
        released = [*self.flights, *sorted(self.unsettled - set(self.flights))]
        for run_id in released:
            try:
                self.ledger.release(run_id, self.host)  # no retries: the store may be what failed
            except Exception:  # noqa: BLE001 - the lease then expires and the run is claimable again
                pass
            self.cancel(run_id, release=False, stop_job=False)
        self.unsettled.clear()
        return released

    def close(self) -> None:
        """Stop the events queue's actor (a pending get would keep it alive in a reused Ray)."""
        import ray

        queue, self.events, self._next_event = self.events, None, None
        if queue is not None:
            try:
                ray.kill(queue.actor)
            except Exception:  # noqa: BLE001 - Ray already stopped: nothing is left to stop
                pass


def live_queue() -> Any:
    """The queue Ray workers send live events to (a zero-CPU actor; None if it cannot start)."""
    from ray.util.queue import Queue

    try:
        return Queue(maxsize=LIVE_QUEUE_SIZE, actor_options={"num_cpus": 0})
    except Exception:  # noqa: BLE001 - without it children are still logged when runs finish
        return None
