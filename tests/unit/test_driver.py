"""The one driver loop (ablation/runtime/driver.py) on the memory ledger with a scripted scheduler,
its pool in this process (the real pool runs cells on Ray: tests/e2e/test_pool_e2e.py). What the
loop owes every scheduler: it fills free slots, hands every outcome back, ends only when the
scheduler is finished and nothing is in flight, and on an error gives the runs in flight back to
pending, tells the scheduler, closes the pool and raises the first error."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dapo_ablate.ablation.experiment.identity import RunSpec
from dapo_ablate.ablation.runtime.driver import (
    FAILED_ATTEMPT,
    RECORDED,
    Driver,
    DriverOptions,
    RunListener,
    RunRequest,
    Settled,
)
from dapo_ablate.ablation.runtime.pool import DONE, FAILED, Outcome, PoolSettings
from dapo_ablate.ablation.store.memory_ledger import MemoryLedger
from dapo_ablate.ablation.store.ledger import PENDING

HOST = "test-host"


class InlinePool:
    """The pool's contract (`RunPool`), in this process: a submitted run is claimed in the ledger
    and its cell function runs at once; `poll` hands its outcome over; at most `limit` in flight."""

    def __init__(self, ledger, host, cell_fn, settings, *, names=str, on_event=None) -> None:
        self.ledger, self.host, self.cell_fn, self.limit = ledger, host, cell_fn, settings.limit
        self.flights: dict[str, Outcome] = {}
        self.envs: dict[str, dict[str, str]] = {}
        """Run id -> the task environment `prepare` gave it."""
        self.on_event = on_event
        self.closed = False
        self.most_in_flight = 0

    def __len__(self) -> int:
        return len(self.flights)

    def __contains__(self, run_id: str) -> bool:
        return run_id in self.flights

    def free(self) -> int:
        return self.limit - len(self.flights)

    def submit(self, run_id, config, *, max_attempts, prepare=None, resources=None, time_limit=None) -> bool:
        if not self.ledger.claim(run_id, self.host, max_attempts=max_attempts):
            return False
        self.envs[run_id] = prepare() if prepare is not None else {}
        if self.on_event is not None:
            self.on_event(run_id, "step", 1, {"loss": 0.0})  # the task's first training step
        try:
            self.flights[run_id] = Outcome(run_id, DONE, result=self.cell_fn(config, "", None))
        except Exception as err:  # noqa: BLE001 - the run's failure, as the real pool reports it
            self.flights[run_id] = Outcome(run_id, FAILED, error=f"{type(err).__name__}: {err}")
        self.most_in_flight = max(self.most_in_flight, len(self.flights))
        return True

    def poll(self, max_wait_s=None) -> list[Outcome]:
        first = next(iter(self.flights))  # one outcome per poll, as runs end one by one
        return [self.flights.pop(first)]

    def abandon(self) -> list[str]:
        released = list(self.flights)
        for run_id in released:
            self.ledger.release(run_id, self.host)
        self.flights.clear()
        return released

    def close(self) -> None:
        self.closed = True


@dataclass
class Scripted(RunListener):
    """A scheduler that asks for `runs` in order, records the pool's outcomes in the ledger, and
    says so in `log`; `raise_on` makes its outcome handler raise for that run (a store going down).
    It listens to the driver too (as a sweep does): the runs' events, the runs given back."""

    runs: list[str]
    raise_on: str | None = None
    log: list[tuple] = field(default_factory=list)
    pool: Any = None

    def start(self, pool, listeners) -> None:
        self.pool = pool
        listeners.note("started")  # what a scheduler tells, it tells through the driver's listeners

    def next_run(self) -> RunRequest | None:
        return RunRequest(self.runs.pop(0), {"value": 0.5}, max_attempts=2) if self.runs else None

    def submitted(self, request: RunRequest, accepted: bool) -> None:
        self.log.append(("submitted", request.run_id, accepted))

    def event(self, run_id, kind, step, data) -> None:
        self.log.append(("event", run_id, kind))

    def on_outcome(self, outcome: Outcome) -> Settled:
        if outcome.run_id == self.raise_on:
            raise RuntimeError("the ledger went down")
        self.log.append(("outcome", outcome.run_id, outcome.kind))
        if outcome.kind == DONE:
            self.pool.ledger.finish(outcome.run_id, outcome.result)
            return Settled(outcome.run_id, f"name-{outcome.run_id}", RECORDED, result=outcome.result)
        self.pool.ledger.fail(outcome.run_id, outcome.error, HOST)
        return Settled(outcome.run_id, f"name-{outcome.run_id}", FAILED_ATTEMPT, error=outcome.error, attempt=1)

    def on_tick(self) -> None:
        self.log.append(("tick",))

    def finished(self) -> bool:
        return not self.runs

    def abandoned(self, released: list[str]) -> None:
        self.log.append(("abandon", tuple(released)))


class InlineDriver(Driver):
    pool_factory = InlinePool


def cell(config: dict, run_dir: str, eval_cache_dir: str | None) -> dict:
    if config.get("fail"):
        raise ValueError("no luck")
    return {"metrics": {"avg@32": config["value"]}, "eval_curve": [], "signals": [], "wall_s": 0.1}


def ledger_with(run_ids: list[str]) -> MemoryLedger:
    ledger = MemoryLedger()
    ledger.ensure_experiment("exp", {})
    ledger.add_runs("exp", [RunSpec(run_id, "1", {"a": 1}, 0, {}) for run_id in run_ids])
    return ledger


def settings(limit: int) -> PoolSettings:
    return PoolSettings({"num_cpus": 1}, limit, 60.0, None, Path("/nonexistent"), Path("/nonexistent"), b"key")


def test_the_loop_runs_every_run_once_within_its_slots_and_ends_when_the_scheduler_is_finished():
    runs = [f"r{i}" for i in range(5)]
    ledger, scheduler = ledger_with(runs), Scripted(list(runs))
    driver = InlineDriver(scheduler, settings(2), ledger, HOST, cell)
    driver.run()
    assert [entry for entry in scheduler.log if entry[0] == "outcome"] == [("outcome", r, DONE) for r in runs]
    assert all(entry[2] for entry in scheduler.log if entry[0] == "submitted")
    assert {row["status"] for row in ledger.runs_table("exp")} == {"done"}
    assert driver.pool.most_in_flight == 2 and driver.pool.closed


def test_a_run_the_ledger_will_not_give_is_said_to_the_scheduler_and_not_run():
    ledger, scheduler = ledger_with(["r0", "r1"]), Scripted(["r0", "r1"])
    assert ledger.claim("r1", "another-host")  # held by another driver
    InlineDriver(scheduler, settings(2), ledger, HOST, cell).run()
    assert ("submitted", "r1", False) in scheduler.log and ("outcome", "r1", DONE) not in scheduler.log
    assert {row["run_id"]: row["status"] for row in ledger.runs_table("exp")}["r0"] == "done"


def test_an_error_gives_the_runs_in_flight_back_tells_the_scheduler_and_raises():
    runs = ["r0", "r1", "r2"]
    ledger, scheduler = ledger_with(runs), Scripted(list(runs), raise_on="r0")
    driver = InlineDriver(scheduler, settings(2), ledger, HOST, cell)
    with pytest.raises(RuntimeError, match="the ledger went down"):
        driver.run()
    assert scheduler.log[-1] == ("abandon", ("r1",))  # r0's outcome was taken; r1 was still in flight
    statuses = {row["run_id"]: row["status"] for row in ledger.runs_table("exp")}
    assert statuses["r1"] == PENDING and driver.pool.closed


def test_a_stop_asked_between_steps_abandons_like_an_error():
    ledger, scheduler = ledger_with(["r0", "r1", "r2"]), Scripted(["r0", "r1", "r2"])

    def stop() -> None:  # Ctrl-C once the first outcome is in (r1 still in flight)
        if any(entry[0] == "outcome" for entry in scheduler.log):
            raise KeyboardInterrupt

    driver = InlineDriver(scheduler, settings(2), ledger, HOST, cell, DriverOptions(check_stop=stop))
    with pytest.raises(KeyboardInterrupt):
        driver.run()
    assert scheduler.log[-1] == ("abandon", ("r1",))
    statuses = {row["run_id"]: row["status"] for row in ledger.runs_table("exp")}
    assert statuses == {"r0": "done", "r1": PENDING, "r2": PENDING}


@dataclass
class Hearing(RunListener):
    """A listener that writes down every event it hears (into `heard`, shared between listeners to
    see their order); `env` is what it adds to each task's environment."""

    tag: str
    heard: list[tuple]
    env: dict[str, str] = field(default_factory=dict)
    fail_on_abandon: bool = False

    def starting(self, run_id):
        self.heard.append((self.tag, "starting", run_id))
        return dict(self.env)

    def run_submitted(self, request, accepted, in_flight):
        self.heard.append((self.tag, "submitted", request.run_id, accepted, in_flight))

    def event(self, run_id, kind, step, data):
        self.heard.append((self.tag, "event", run_id, kind, step))

    def settled(self, settled, in_flight):
        self.heard.append((self.tag, "settled", settled.run_id, settled.what, settled.name, in_flight))

    def note(self, line):
        self.heard.append((self.tag, "note", line))

    def abandoned(self, released):
        self.heard.append((self.tag, "abandoned", tuple(released)))
        if self.fail_on_abandon:
            raise RuntimeError("the tracking store is down too")


def test_listeners_hear_each_step_of_a_runs_life_in_order_after_the_scheduler():
    heard: list[tuple] = []
    first, second = Hearing("a", heard, env={"MLFLOW_RUN_ID": "child"}), Hearing("b", heard, env={"OTHER": "1"})
    ledger, scheduler = ledger_with(["r0"]), Scripted(["r0"])
    driver = InlineDriver(scheduler, settings(1), ledger, HOST, cell, DriverOptions(listeners=(first, second)))
    driver.run()
    assert heard == [
        ("a", "note", "started"), ("b", "note", "started"),
        ("a", "starting", "r0"), ("b", "starting", "r0"),  # claimed; its task not started yet
        ("a", "event", "r0", "step", 1), ("b", "event", "r0", "step", 1),
        ("a", "submitted", "r0", True, 1), ("b", "submitted", "r0", True, 1),
        ("a", "settled", "r0", RECORDED, "name-r0", 0), ("b", "settled", "r0", RECORDED, "name-r0", 0),
    ]
    assert driver.pool.envs["r0"] == {"MLFLOW_RUN_ID": "child", "OTHER": "1"}  # every listener's environment
    assert ("event", "r0", "step") in scheduler.log  # the scheduler hears the run's events too


def test_a_failed_attempt_reaches_the_listeners_as_the_scheduler_settled_it():
    heard: list[tuple] = []
    ledger = ledger_with(["r0"])
    scheduler = Scripted(["r0"])
    scheduler.next_run = lambda: RunRequest(scheduler.runs.pop(0), {"fail": True}, max_attempts=2) if scheduler.runs else None
    InlineDriver(scheduler, settings(1), ledger, HOST, cell, DriverOptions(listeners=(Hearing("a", heard),))).run()
    assert ("a", "settled", "r0", FAILED_ATTEMPT, "name-r0", 0) in heard
    assert {row["run_id"]: row["status"] for row in ledger.runs_table("exp")} == {"r0": "failed"}


def test_on_an_error_every_listener_hears_the_runs_given_back_and_the_first_error_is_raised():
    heard: list[tuple] = []
    runs = ["r0", "r1", "r2"]
    ledger, scheduler = ledger_with(runs), Scripted(list(runs), raise_on="r0")
    listeners = (Hearing("a", heard, fail_on_abandon=True), Hearing("b", heard))
    driver = InlineDriver(scheduler, settings(2), ledger, HOST, cell, DriverOptions(listeners=listeners))
    with pytest.raises(RuntimeError, match="the ledger went down"):  # not the listener's own failure
        driver.run()
    assert heard[-2:] == [("a", "abandoned", ("r1",)), ("b", "abandoned", ("r1",))]
    assert scheduler.log[-1] == ("abandon", ("r1",))  # the scheduler first
