"""The one driver loop: every experiment (a factorial, a sweep, an adaptive design) is a
`Scheduler` that this loop runs on one `RunPool`, and whatever watches or logs the runs (the
console display, MLflow) is a `RunListener` of the loop's events.

A scheduler answers what differs between designs, in the spirit of Ray Tune's Searcher:

- **what next** (`next_run`): the next run to start in a free slot, or None for nothing now;
  the driver submits it to the pool (claim, lease, Ray task) and says whether the ledger gave it
  (`submitted`);
- **what an outcome changes** (`on_outcome`): a run finished, failed, timed out or lost its
  lease; the scheduler records it (through the pool: `record`, `fail`, `cancel`), decides what
  follows, and says what it decided (`Settled`) for the listeners;
- **when it is finished** (`finished`): nothing queued or awaited elsewhere; with nothing in
  flight the loop ends.

Besides: `start` (the pool, and the `Listeners` through which the scheduler tells of notes, a
grown plan, a look or an event of its own design) and `on_tick` every `tick_s` (heartbeats a
scheduler keeps of its own: a sweep's trials').

A listener hears each step of a run's life (`RunListener`: starting, run_submitted, event,
settled, note, grown, looked, abandoned), in the order the listeners were given. A scheduler
that is itself a `RunListener` hears them first: a sweep's pruner hears the runs' evaluations
(`event`), and a sweep queues its running trials again when the driver stops (`abandoned`:
Ctrl-C, SIGTERM or an error; the pool has given the runs in flight back to pending). Only the
driver's process writes the ledger and the trackers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from dapo_ablate.ablation.runtime.pool import Outcome, PoolSettings, RunPool
from dapo_ablate.ablation.runtime.time_limit import TimeLimit
from dapo_ablate.ablation.store.ledger import Ledger

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan


@dataclass(frozen=True)
class RunRequest:
    """A run a scheduler wants started: its config, its attempt budget (counted in the ledger,
    across invocations), the task's own Ray resources if not the pool's, and `prepare`, called
    once the run is claimed and before its task starts, returning extra task environment, and its
    own time limit (None: ``executor.run_timeout_s``); `name`, the run's name in what the user
    reads (empty: its id)."""

    run_id: str
    config: dict[str, Any]
    max_attempts: int
    resources: dict[str, float] | None = None
    prepare: Callable[[], dict[str, str]] | None = None
    time_limit: TimeLimit | None = None
    name: str = ""


RECORDED = "recorded"
"""`Settled.what`: the run finished and this driver recorded its result."""
FAILED_ATTEMPT = "failed"
"""`Settled.what`: the attempt failed (or timed out, or its result could not be stored)."""
DONE_ELSEWHERE = "done elsewhere"
"""`Settled.what`: the run finished, but another driver had recorded it meanwhile."""
LEASE_LOST = "lease lost"
"""`Settled.what`: another driver took the run's lease over; it finishes the run."""


@dataclass(frozen=True)
class Settled:
    """What a scheduler made of one outcome (`Scheduler.on_outcome`), for the listeners: the run,
    its name, what became of it (`what`: RECORDED, FAILED_ATTEMPT, DONE_ELSEWHERE, LEASE_LOST),
    its result or error, the attempt (this invocation's count) and whether it is retried."""

    run_id: str
    name: str
    what: str
    result: dict[str, Any] | None = None
    error: str = ""
    attempt: int = 0
    retry: bool = False


class RunListener:
    """What watches a driver's runs (the console display, MLflow): each method is one event of a
    run's life, a no-op here; a listener overrides those it hears."""

    def starting(self, run_id: str) -> dict[str, str]:
        """The run is claimed and its task is about to start: extra task environment."""
        return {}

    def run_submitted(self, request: RunRequest, accepted: bool, in_flight: int) -> None:
        """The pool was asked to start `request`; `accepted`: the ledger gave it."""

    def event(self, run_id: str, kind: str, step: int, data: dict[str, Any]) -> None:
        """A run's training step, evaluation or note while it trains."""

    def settled(self, settled: Settled | None, in_flight: int) -> None:
        """An outcome, as the scheduler settled it (None: a scheduler that says nothing of it)."""

    def note(self, line: str) -> None:
        """A line for whoever watches."""

    def grown(self, plan: Plan, added: int) -> None:
        """The plan grew by `added` runs (an adaptive design's look)."""

    def looked(self, looks: list[dict[str, Any]]) -> None:
        """The looks stored so far, after a new one (an adaptive design's)."""

    def abandoned(self, released: list[str]) -> None:
        """Ctrl-C, SIGTERM or an error: the runs in flight went back to pending."""


class Listeners(RunListener):
    """The listeners of one driver, told each event in order (a scheduler tells its notes, a grown
    plan and its looks through this)."""

    def __init__(self, listeners: list[RunListener]) -> None:
        self.listeners = list(listeners)

    def starting(self, run_id: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for listener in self.listeners:
            env.update(listener.starting(run_id))
        return env

    def run_submitted(self, request: RunRequest, accepted: bool, in_flight: int) -> None:
        for listener in self.listeners:
            listener.run_submitted(request, accepted, in_flight)

    def event(self, run_id: str, kind: str, step: int, data: dict[str, Any]) -> None:
        for listener in self.listeners:
            listener.event(run_id, kind, step, data)

    def settled(self, settled: Settled | None, in_flight: int) -> None:
        for listener in self.listeners:
            listener.settled(settled, in_flight)

    def note(self, line: str) -> None:
        for listener in self.listeners:
            listener.note(line)

    def grown(self, plan: Plan, added: int) -> None:
        for listener in self.listeners:
            listener.grown(plan, added)

    def looked(self, looks: list[dict[str, Any]]) -> None:
        for listener in self.listeners:
            listener.looked(looks)

    def tell(self, event: str, *args: Any) -> None:
        """A design's own event (a sweep's ``trial_started``, ``trial_finished``): each listener's
        method of that name, where it has one."""
        for listener in self.listeners:
            hears = getattr(listener, event, None)
            if hears is not None:
                hears(*args)

    def abandoned(self, released: list[str]) -> None:
        """Each listener told, whatever another one meets (the store may be what failed)."""
        for listener in self.listeners:
            try:
                listener.abandoned(released)
            except Exception:  # noqa: BLE001 - the first error is the one the user sees
                pass


class Scheduler(Protocol):
    """What the `Driver` asks of an experiment (see the module docstring)."""

    def start(self, pool: RunPool, listeners: Listeners) -> None: ...

    def next_run(self) -> RunRequest | None: ...

    def submitted(self, request: RunRequest, accepted: bool) -> None: ...

    def on_outcome(self, outcome: Outcome) -> Settled | None: ...

    def on_tick(self) -> None: ...

    def finished(self) -> bool: ...


@dataclass(frozen=True)
class DriverOptions:
    """How a driver steps: `check_stop` raises KeyboardInterrupt for a Ctrl-C or SIGTERM whose own
    interrupt a library swallowed (asked at every step); `tick_s`: how often the scheduler's
    `on_tick` is called (None: never, the pool is polled without a bound); `listeners`: what
    hears the runs' events, in order."""

    check_stop: Callable[[], None] = lambda: None
    tick_s: float | None = None
    listeners: tuple[RunListener, ...] = ()


class Driver:
    """Runs one scheduler on the one pool it builds (`RunPool`: the runs' tasks on Ray, claimed in
    `ledger` by this driver's `host`, each running `cell_fn`) until the scheduler is finished and
    nothing is in flight, telling its listeners each event (`DriverOptions`). Ray must be
    connected."""

    pool_factory: Callable[..., Any] = RunPool
    """Builds the pool from (ledger, host, cell_fn, settings, names=, on_event=): `RunPool` (Ray); the
    driver's own tests run it on an in-process pool (tests/unit/test_driver.py)."""

    def __init__(self, scheduler: Scheduler, settings: PoolSettings, ledger: Ledger, host: str,
                 cell_fn: Callable[..., dict[str, Any]], options: DriverOptions | None = None) -> None:
        options = options or DriverOptions()
        self.scheduler, self.check_stop, self.tick_s = scheduler, options.check_stop, options.tick_s
        first = [scheduler] if isinstance(scheduler, RunListener) else []  # a scheduler that listens hears first
        self.listeners = Listeners([*first, *options.listeners])
        self.names: dict[str, str] = {}
        """Run id -> its name (`RunRequest.name`), for the pool's sentences."""
        self.pool = self.pool_factory(ledger, host, cell_fn, settings, names=self._name, on_event=self.listeners.event)

    def run(self) -> None:
        scheduler, pool = self.scheduler, self.pool
        scheduler.start(pool, self.listeners)
        last_tick = time.monotonic()
        try:
            while True:
                self.check_stop()
                self._fill()
                if not len(pool) and scheduler.finished():
                    return
                for outcome in pool.poll(max_wait_s=self.tick_s):
                    self.listeners.settled(scheduler.on_outcome(outcome), len(pool))
                if self.tick_s is not None and time.monotonic() - last_tick >= self.tick_s:
                    scheduler.on_tick()
                    last_tick = time.monotonic()
        except BaseException:
            self.listeners.abandoned(pool.abandon())  # (a failure there is not the error the user sees)
            raise
        finally:
            pool.close()

    def _name(self, run_id: str) -> str:
        return self.names.get(run_id) or run_id

    def _prepare(self, request: RunRequest) -> Callable[[], dict[str, str]]:
        """What the pool calls once the run is claimed: the listeners' task environment (its MLflow
        run), then the scheduler's own (`RunRequest.prepare`)."""
        def prepare() -> dict[str, str]:
            env = self.listeners.starting(request.run_id)
            return {**env, **(request.prepare() if request.prepare is not None else {})}
        return prepare

    def _fill(self) -> None:
        """Start runs while slots are free and the scheduler has one."""
        while self.pool.free() > 0:
            request = self.scheduler.next_run()
            if request is None:
                return
            self.names[request.run_id] = request.name
            accepted = request.run_id not in self.pool and self.pool.submit(
                request.run_id, request.config, max_attempts=request.max_attempts,
                prepare=self._prepare(request), resources=request.resources, time_limit=request.time_limit)
            self.scheduler.submitted(request, accepted)
            self.listeners.run_submitted(request, accepted, len(self.pool))
