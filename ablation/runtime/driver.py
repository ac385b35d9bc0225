"""The one driver loop: every experiment (a factorial, a sweep, an adaptive design) is a
`Scheduler` that this loop runs on one `RunPool`.

A scheduler answers the driver's three questions, in the spirit of Ray Tune's Searcher:

- **what next** (`next_run`): the next run to start in a free slot, or None for nothing now;
  the driver submits it to the pool (claim, lease, Ray task) and says whether the ledger gave it
  (`submitted`);
- **an event** (`on_event`): a run's training step, evaluation or Ray job id while it trains
  (live MLflow children, a sweep's pruner);
- **an outcome** (`on_outcome`): a run finished, failed, timed out or lost its lease; the
  scheduler records it (through the pool: `record`, `fail`, `cancel`) and decides what follows.

Besides: `on_tick` every `tick_s` (heartbeats a scheduler keeps of its own), `finished` (nothing
queued or awaited elsewhere: with nothing in flight the loop ends) and `abandon` (Ctrl-C,
SIGTERM or an error: the pool has given the runs in flight back to pending; the scheduler
updates its own records). Only the driver's process writes the ledger and the trackers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from dapo_ablate.ablation.runtime.pool import Outcome, PoolSettings, RunPool
from dapo_ablate.ablation.runtime.time_limit import TimeLimit
from dapo_ablate.ablation.store.ledger import Ledger


@dataclass(frozen=True)
class RunRequest:
    """A run a scheduler wants started: its config, its attempt budget (counted in the ledger,
    across invocations), the task's own Ray resources if not the pool's, and `prepare`, called
    once the run is claimed and before its task starts, returning extra task environment, and its
    own time limit (None: ``executor.run_timeout_s``)."""

    run_id: str
    config: dict[str, Any]
    max_attempts: int
    resources: dict[str, float] | None = None
    prepare: Callable[[], dict[str, str]] | None = None
    time_limit: TimeLimit | None = None


class Scheduler(Protocol):
    """What the `Driver` asks of an experiment (see the module docstring)."""

    def start(self, pool: RunPool) -> None: ...

    def next_run(self) -> RunRequest | None: ...

    def submitted(self, request: RunRequest, accepted: bool) -> None: ...

    def on_event(self, run_id: str, kind: str, step: int, data: dict[str, Any]) -> None: ...

    def on_outcome(self, outcome: Outcome) -> None: ...

    def on_tick(self) -> None: ...

    def finished(self) -> bool: ...

    def run_name(self, run_id: str) -> str: ...

    def abandon(self, released: list[str]) -> None: ...


class Driver:
    """Runs one scheduler on the one pool it builds (`RunPool`: the runs' tasks on Ray, claimed in
    `ledger` by this driver's `host`, each running `cell_fn`) until the scheduler is finished and
    nothing is in flight. `check_stop` raises KeyboardInterrupt for a Ctrl-C or SIGTERM whose own
    interrupt a library swallowed; it is asked at every step. Ray must be connected."""

    pool_factory: Callable[..., Any] = RunPool
    """Builds the pool from (ledger, host, cell_fn, settings, names=, on_event=): `RunPool` (Ray); the
    driver's own tests run it on an in-process pool (tests/unit/test_driver.py)."""

    def __init__(self, scheduler: Scheduler, settings: PoolSettings, ledger: Ledger, host: str,
                 cell_fn: Callable[..., dict[str, Any]], *, check_stop: Callable[[], None] = lambda: None,
                 tick_s: float | None = None) -> None:
        self.scheduler, self.check_stop, self.tick_s = scheduler, check_stop, tick_s
        self.pool = self.pool_factory(ledger, host, cell_fn, settings, names=scheduler.run_name,
                                      on_event=scheduler.on_event)

    def run(self) -> None:
        scheduler, pool = self.scheduler, self.pool
        scheduler.start(pool)
        last_tick = time.monotonic()
        try:
            while True:
                self.check_stop()
                self._fill()
                if not len(pool) and scheduler.finished():
                    return
                for outcome in pool.poll(max_wait_s=self.tick_s):
                    scheduler.on_outcome(outcome)
                if self.tick_s is not None and time.monotonic() - last_tick >= self.tick_s:
                    scheduler.on_tick()
                    last_tick = time.monotonic()
        except BaseException:
            released = pool.abandon()
            try:
                scheduler.abandon(released)
            except Exception:  # noqa: BLE001 - the first error is the one the user sees (a store may be down)
                pass
            raise
        finally:
            pool.close()

    def _fill(self) -> None:
        """Start runs while slots are free and the scheduler has one."""
        while self.pool.free() > 0:
            request = self.scheduler.next_run()
            if request is None:
                return
            accepted = request.run_id not in self.pool and self.pool.submit(
                request.run_id, request.config, max_attempts=request.max_attempts,
                prepare=request.prepare, resources=request.resources, time_limit=request.time_limit)
            self.scheduler.submitted(request, accepted)
