"""Fuzzing concurrent drivers of one ``design: adaptive`` experiment: two or three drivers (the
product's `ExperimentRun` with its one `Driver`, `AdaptiveScheduler` and the claims engine's
look policy, `app.adaptive.look_policy`) share one ledger (a SQLite file, then PostgreSQL), in
orders hypothesis chooses.

Each driver runs in its own thread, but only one thread runs at a time: every ledger call of a
driver first waits for its turn (`Turns`), and hypothesis picks, at each turn, which driver
takes its next step, whether a new driver starts (on a free slot: a machine; its plan read when
it starts, or stage 1's, as a driver that loaded its spec before any look), or whether a driver
dies there (as SIGKILL: nothing more reaches the ledger, its claimed runs stay running). A
driver started later on a dead driver's slot gives its runs back (`hosts.release_orphans`), as
`run` on that machine does. So a driver may start after the experiment stopped or grew, find its
last runs held by another one, or lose a look to another's. The runs are an in-process pool and
a cheap deterministic cell (a planted clip_higher effect hypothesis chooses, a noise fixed by
cell and seed); nothing of the scheduler, the ledger or the looks is replaced. Once hypothesis's
drivers ended, drivers are restarted on the dead slots until the experiment ends.

The properties, after every interleaving: looks numbered 1, 2, ... each stored once, each made
on the plan every earlier look grew, only the last one stopped; the ledger holds exactly the
plan the looks add up to (a stopped experiment never grows), every run of it done, recorded
once; the last look covers every run. Each driver that ended exits 0 (a run another driver
holds is that driver's share), and one whose runs are all done publishes the headline of the
ledger's last look: the plan and the runs the final ledger holds, the same lines.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st

from dapo_ablate.ablation.app.adaptive import look_policy
from dapo_ablate.ablation.app.report import experiment_headline
from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import build_spec
from dapo_ablate.ablation.runtime import experiment_run
from dapo_ablate.ablation.runtime.driver import Driver
from dapo_ablate.ablation.runtime.experiment_run import ExperimentRun
from dapo_ablate.ablation.runtime.factorial import ExperimentSummary, RunOptions
from dapo_ablate.ablation.store.adaptive_state import current_plan
from dapo_ablate.ablation.store.ledger import SQLLedger

import test_adaptive_drivers
from conftest import fresh_postgres_database
from support import HANG_GUARD_S, spec_data
from test_fuzz_strategies import EXAMPLES, FUZZ

DRIVERS_FUZZ = settings(FUZZ, max_examples=min(EXAMPLES, 12), phases=[Phase.explicit, Phase.generate, Phase.shrink])
"""Each example runs several drivers to the end of an experiment (a few seconds): fewer than the spec fuzzers
(12 per database in CI; the race this fuzz found failed within its first 9 examples each time)."""
SLOTS = 3
"""Machines a driver can run on: at most this many drivers at once."""
DRAWN_STEPS = 120
"""Turns hypothesis chooses; the drivers still running afterwards take turns in order."""
NO_PID = 2**22
"""Pids from here on exist on no Linux (pid_max is at most 2**22): a fake driver's process is never alive."""


class Killed(BaseException):
    """A driver that died (SIGKILL): raised at its next ledger call, which never reaches the ledger."""


class Turns:
    """One driver thread runs at a time: `wait` (in a driver's thread, before each ledger call)
    hands the turn back and waits until `give` names this driver again."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.turn: int | None = None
        self.killed: set[int] = set()
        self.local = threading.local()

    def wait(self) -> None:
        who = getattr(self.local, "who", None)
        if who is None or getattr(self.local, "locked", False):  # the test's own reads; under the experiment lock
            return
        with self.cond:
            if who not in self.killed:
                self.turn = None
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.turn == who)
            if who in self.killed:
                raise Killed()

    def give(self, who: int, thread: threading.Thread | None = None) -> None:
        """Driver `who` runs until its next ledger call (or its end); `thread`: its thread, started now."""
        with self.cond:
            self.turn = who
            self.cond.notify_all()
            if thread is not None:
                thread.start()
            assert self.cond.wait_for(lambda: self.turn is None, timeout=HANG_GUARD_S), f"driver {who} blocked outside its turn"

    def ended(self) -> None:
        with self.cond:
            self.turn = None
            self.cond.notify_all()


class SteppedLedger:
    """A driver's own `SQLLedger`, each call made in the driver's turn; counts the results it stored
    (by run id), and the looks another driver had stored first ("look adopted")."""

    def __init__(self, url: str, turns: Turns, stored: Counter) -> None:
        self.inner, self.turns, self.stored = SQLLedger(url), turns, stored

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if not callable(method) or name in ("close", "__enter__", "__exit__"):
            return method

        def in_turn(*args: Any, **kwargs: Any) -> Any:
            self.turns.wait()
            answer = method(*args, **kwargs)
            if name == "finish" and answer:
                self.stored[args[0]] += 1
            if name == "record_look" and not answer:
                self.stored["look adopted"] += 1
            return answer

        return in_turn

    def close(self) -> None:
        self.inner.close()


class InlinePool(test_adaptive_drivers.InlinePool):
    """`RunPool`'s contract in this thread (test_adaptive_drivers' pool), without the step event
    it sends on submit: here an event would reach the listeners between two ledger turns."""

    def __init__(self, ledger, host, cell_fn, settings, *, names=str, on_event=None) -> None:
        super().__init__(ledger, host, cell_fn, settings, names=names, on_event=None)


def planted(effect: float) -> Callable[..., dict]:
    """avg@32 = 0.40 + `effect` x clip_higher + noise (sd 0.01, fixed by cell and seed)."""

    def cell(config: dict, run_dir: str, eval_cache_dir: str | None) -> dict:
        techniques, seed = config["techniques"], config["schedule"]["seed"]
        digest = hashlib.sha256(f"{sorted(techniques.items())}-{seed}".encode()).digest()
        noise = (int.from_bytes(digest[:4], "big") / 2**32 - 0.5) * 0.035  # uniform, sd 0.01
        accuracy = 0.40 + effect * techniques["clip_higher"] + noise
        return {"metrics": {"avg@32": accuracy}, "eval_curve": [{"step": 2, "avg@32": accuracy}], "signals": [],
                "tokens_generated": 100, "tokens_discarded": 0, "wall_s": 0.1}

    return cell


@dataclass
class Ended:
    """What one driver said at its end: its summary and the headline it published (None: none)."""

    who: int
    summary: ExperimentSummary | None = None
    headline: str | None = None
    error: BaseException | None = None


@dataclass
class Drivers:
    """The drivers of one example: each a thread on its slot, taking turns (`Turns`)."""

    spec: Any
    cell: Callable[..., dict]
    turns: Turns = field(default_factory=Turns)
    stored: Counter = field(default_factory=Counter)
    slots: dict[int, int] = field(default_factory=dict)
    """Slot -> its driver now (alive or not)."""
    alive: set[int] = field(default_factory=set)
    ended: list[Ended] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)
    counter: Iterator[int] = field(default_factory=itertools.count)

    def start(self, slot: int, stale: bool) -> None:
        """A new driver on `slot`: its plan read now from the ledger (or stage 1's: `stale`)."""
        who = next(self.counter)
        self.slots[slot] = who
        self.alive.add(who)
        host = f"fuzz-slot{slot}/pidns-0:{NO_PID + who}"
        self.turns.give(who, threading.Thread(target=self._drive, args=(who, host, stale), daemon=True))

    def _drive(self, who: int, host: str, stale: bool) -> None:
        self.turns.local.who, ended = who, Ended(who)
        try:
            ledger = SteppedLedger(self.spec.ledger, self.turns, self.stored)
            plan = expand(self.spec, []) if stale else current_plan(self.spec, ledger)
            run = ExperimentRun(self.spec, plan, self.cell, RunOptions(progress=False), ledger=ledger,
                                policy=look_policy(self.spec))
            run.host = host  # this slot's machine; a dead driver's pid is never alive
            ended.summary = run.run()
            if ended.summary.all_done and not ended.summary.interrupted:  # as `run` (app.experiment.run) publishes
                ended.headline = experiment_headline(self.spec, ended.summary.plan, ended.summary.records,
                                                     ended.summary.parent_run_id)
        except Killed:
            return
        except BaseException as error:  # noqa: BLE001 - reported with the interleaving by the test
            ended.error = error
        finally:
            self.alive.discard(who)
            if who not in self.turns.killed:
                self.ended.append(ended)
            self.turns.ended()

    def step(self, who: int) -> None:
        self.turns.give(who)

    def kill(self, who: int) -> None:
        self.turns.killed.add(who)
        self.dead.add(next(slot for slot, held in self.slots.items() if held == who))
        self.turns.give(who)  # it unwinds without another ledger call

    def free_slots(self) -> list[int]:
        return [slot for slot in range(SLOTS) if self.slots.get(slot) not in self.alive]


@contextmanager
def lock_without_turns(turns: Turns) -> Iterator[None]:
    """The experiment lock as `run` takes it; a driver holding it takes no turns (another driver
    waiting for it would hold the one turn)."""
    real = experiment_run.experiment_lock

    @contextmanager
    def locked(url: str, name: str) -> Iterator[None]:
        with real(url, name):
            turns.local.locked = True
            try:
                yield
            finally:
                turns.local.locked = False

    experiment_run.experiment_lock = locked
    try:
        yield
    finally:
        experiment_run.experiment_lock = real


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledgers(request, tmp_path_factory) -> Callable[[], Any]:
    """A fresh ledger per example (the runs of one plan have the same ids in every example): a
    context giving its folder and URL, a SQLite file, then a fresh PostgreSQL database; one
    MLflow store for all (each example its own experiment name: a run id does not depend on it)."""
    root, examples = tmp_path_factory.mktemp("drivers"), itertools.count()
    admin = request.getfixturevalue("postgres_admin") if request.param == "postgresql" else None

    @contextmanager
    def fresh() -> Iterator[tuple[Path, str]]:
        folder = root / f"example-{next(examples)}"
        folder.mkdir()
        if admin is None:
            yield folder, f"sqlite:///{folder / 'ledger.db'}"
            return
        with fresh_postgres_database(admin, "dapo_fuzz_drivers") as url:
            yield folder, url

    return fresh


@pytest.fixture(scope="module")
def inline() -> Iterator[None]:
    saved = Driver.pool_factory, experiment_run.capacity
    Driver.pool_factory = InlinePool
    experiment_run.capacity = lambda spec, runs: 2
    yield
    Driver.pool_factory, experiment_run.capacity = saved


ACTIONS = st.sampled_from(["step", "step", "step", "start", "kill"])


def interleave(drivers: Drivers, data: st.DataObject, starts: int, kills: int) -> None:
    """Hypothesis's turns, then every live driver to its end, then a driver on each dead slot
    until the experiment's last look stopped it."""
    for _ in range(DRAWN_STEPS):
        if not drivers.alive and not starts:
            break
        action = data.draw(ACTIONS) if drivers.alive else "start"
        if action == "start" and starts and drivers.free_slots():
            drivers.start(data.draw(st.sampled_from(drivers.free_slots())), data.draw(st.booleans()))
            starts -= 1
        elif action == "kill" and kills and drivers.alive:
            drivers.kill(data.draw(st.sampled_from(sorted(drivers.alive))))
            kills -= 1
        elif drivers.alive:
            drivers.step(data.draw(st.sampled_from(sorted(drivers.alive))))
    finish(drivers)


def finish(drivers: Drivers) -> None:
    """Every live driver to its end, in turn; then drivers restarted on the dead slots (and one
    more) until the last look stopped the experiment."""
    while drivers.alive:
        for who in sorted(drivers.alive):
            drivers.step(who)
    for _ in range(SLOTS + 2):
        if stopped(drivers.spec):
            return
        for slot in sorted(drivers.dead) or [0]:
            drivers.start(slot, stale=False)
            while drivers.alive:
                drivers.step(min(drivers.alive))
        drivers.dead.clear()


def stopped(spec) -> bool:
    with SQLLedger(spec.ledger) as ledger:
        looks = ledger.looks(spec.name) if ledger.get_experiment(spec.name) else []
    return bool(looks) and bool(looks[-1].get("stopped"))


def check_ledger(spec, stored: Counter) -> tuple[Any, list[dict[str, Any]]]:
    """The ledger's invariants (module docstring); the final plan and its runs' records."""
    with SQLLedger(spec.ledger) as ledger:
        looks, rows, records = ledger.looks(spec.name), ledger.runs_table(spec.name), ledger.results(spec.name)
    assert [look["number"] for look in looks] == list(range(1, len(looks) + 1)), looks
    assert looks and looks[-1]["stopped"] and not any(look["stopped"] for look in looks[:-1]), looks
    grown: list[tuple[str, int]] = []
    for look in looks:  # each look made on the plan every earlier look grew, never a stale one
        assert look["runs"] == len(expand(spec, grown).runs), (look["number"], look["runs"], len(grown))
        grown += [(key, seed) for key, seed in look["added"]]
    plan = expand(spec, grown)
    assert {row["run_id"] for row in rows} == {run.run_id for run in plan.runs}  # nothing grown after the stop
    assert all(row["status"] == "done" for row in rows), [(row["run_id"], row["status"]) for row in rows]
    assert looks[-1]["runs"] == len(plan.runs) == len(records)  # the last look covers every run
    assert set(stored) == {run.run_id for run in plan.runs} and set(stored.values()) == {1}, stored  # recorded once
    return plan, records


def check_drivers(drivers: Drivers, plan, records: list[dict[str, Any]]) -> None:
    """Each driver that ended agrees with the ledger: exit 0, and a headline only of the last look's plan."""
    final = None
    for ended in drivers.ended:
        summary = ended.summary
        assert summary.exit_code == 0, (ended.who, summary.counts, summary.held, summary.failures)
        if ended.headline is None:
            continue
        assert {run.run_id for run in summary.plan.runs} == {run.run_id for run in plan.runs}, (
            ended.who, len(summary.plan.runs), len(plan.runs))
        assert sorted(r["run_id"] for r in summary.records) == sorted(r["run_id"] for r in records)
        final = final or experiment_headline(drivers.spec, plan, records, summary.parent_run_id)
        assert ended.headline == final, (ended.who, ended.headline, final)


@DRIVERS_FUZZ
@given(data=st.data(), effect=st.sampled_from([0.0, 0.03, 0.1]), margin=st.sampled_from([2.0, 5.0, 20.0]),
       starts=st.integers(2, 4), kills=st.integers(0, 2))
def test_concurrent_adaptive_drivers_agree_with_the_ledger(ledgers, inline, data, effect, margin, starts, kills):
    with ledgers() as (folder, ledger_url):
        adaptive = {"max_seeds": 4, "effect_of_interest": margin}
        spec = build_spec(spec_data(folder, f"adapt-{folder.name}", design="adaptive", seeds=2, adaptive=adaptive,
                                    ledger=ledger_url, tracking={"uri": f"sqlite:///{folder.parent}/mlflow.db"}))
        drivers = Drivers(spec, planted(effect))
        with lock_without_turns(drivers.turns):
            interleave(drivers, data, starts, kills)
        for ended in drivers.ended:
            if ended.error is not None:
                raise ended.error
        event(f"{drivers.stored.pop('look adopted', 0)} looks adopted from another driver")
        plan, records = check_ledger(spec, drivers.stored)
        event(f"{len(plan.runs)} runs; {len(drivers.ended)} drivers ended, {len(drivers.turns.killed)} killed")
        event(f"{sum(bool(e.summary and e.summary.held) for e in drivers.ended)} drivers ended with runs held elsewhere")
        event(f"{sum(e.headline is not None for e in drivers.ended)} drivers published a headline")
        check_drivers(drivers, plan, records)
