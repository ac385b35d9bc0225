"""What both ledgers share (`SQLLedger`, `MemoryLedger`; contract in `ablation.store.ledger`): the
run state machine, the rows they return, their errors and defaults. Each rule is stated once.

A rule is written over a run's columns with ``==``, ``<``, ``&``, ``|`` and ``+`` only, so the same
statement serves both ledgers: given the `Run` table it builds the SQL condition or the new values
that the SQL ledger sends in one guarded UPDATE; given a `Run` row it gives the bool and the values
that the memory ledger applies under its lock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from dapo_ablate.ablation.experiment.identity import RunSpec
from dapo_ablate.ablation.store.ledger_models import DONE, FAILED, PENDING, RUN_STATUSES, RUNNING
from dapo_ablate.ablation.store.ledger_values import COUNTS, result_problem, result_values, to_json

DEFAULT_LEASE_S = 120.0
"""A running run whose heartbeat is older than this (seconds) may be claimed by another driver."""
DEFAULT_MAX_ATTEMPTS = 3
"""A failed run is claimable again while it has been attempted fewer times than this."""

RUN_ORDER = ("cell_key", "seed", "run_id")
"""The order of every list of runs a ledger returns."""


class LedgerError(RuntimeError):
    """A ledger problem the user can fix, stated in one sentence."""


@dataclass(frozen=True)
class ExperimentRecord:
    id: int
    name: str
    spec: dict[str, Any]
    created_at: datetime
    mlflow_parent_run_id: str | None
    digest: str | None = None
    """What the experiment's name is bound to (`ensure_experiment`); None: not bound yet."""


def unreadable_experiment(url: str, name: str, err: BaseException) -> LedgerError:
    """Experiment `name`'s row holds a spec this ledger did not write (edited by hand)."""
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return LedgerError(
        f"the ledger at {url} holds experiment {name!r} with a recorded spec that does not read ({reason[:120]}): "
        "a row edited outside dapo-ablate; restore the ledger from a copy, or point `ledger:` at another database"
    )


def other_design(url: str, name: str, digest: str | None) -> LedgerError:
    """`ensure_experiment` with a digest other than the one experiment `name` is bound to."""
    return LedgerError(
        f"the ledger at {url} already has an experiment named {name!r} made from another spec "
        f"(digest {str(digest)[:12]}); give this spec another name, e.g. `name: {name}-2` in the spec or "
        f"`name={name}-2` on the command line (runs the two share are not trained again)"
    )


def no_experiment(url: str, name: str) -> LedgerError:
    return LedgerError(
        f"the ledger at {url} has no experiment named {name!r}; "
        "check `name:` in the spec or run it first"
    )


def not_a_ledger(url: str, tables: list[str]) -> LedgerError:
    """A database that holds tables and not a ledger's: another application's, never written."""
    shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    return LedgerError(
        f"the database at {url} is not a dapo-ablate ledger (it holds other tables: {shown}) and is left as it is; "
        "point `ledger:` at a new file or an empty database"
    )


def no_run(run_id: str) -> KeyError:
    """An unknown run id is a caller's bug, not a user's mistake."""
    return KeyError(f"no run {run_id!r} in the ledger")


def now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class LeaseWindow:
    """When a running run's lease still holds: its last heartbeat is within `lease_s` of now.
    Older, its driver stopped renewing it; later (beyond the clock skew `lease_s` allows), or
    missing, no driver wrote it (a hand-edited row): expired too, or the run waited for ever."""

    cutoff: datetime
    latest: datetime


def lease_cutoff(at: datetime, lease_s: float) -> LeaseWindow:
    """The window of heartbeats that still hold a lease at `at`."""
    return LeaseWindow(at - timedelta(seconds=lease_s), at + timedelta(seconds=lease_s))


# -- which runs a transition applies to (run: the `Run` table or a `Run` row) -------------------


def _outside(stamp: Any, window: LeaseWindow) -> Any:
    """`stamp` missing (SQL: IS NULL) or outside `window`."""
    if stamp is None:  # a row's missing stamp (the table's column is never None)
        return True
    return (stamp == None) | (stamp < window.cutoff) | (stamp > window.latest)  # SQL: IS NULL


def lease_expired(run: Any, window: LeaseWindow) -> Any:
    """Running, with a last heartbeat outside `window`: its driver stopped renewing the lease (or
    none wrote it)."""
    return (run.status == RUNNING) & _outside(run.heartbeat_at, window)


def claimable(run: Any, cutoff: LeaseWindow, max_attempts: int) -> Any:
    """What `claim` takes: a pending run; a failed one with attempts left; a running one whose
    lease expired, with attempts left (the crashed attempt counts: the run may be what kills its
    drivers)."""
    attempts_left = run.attempts < max_attempts
    return (
        (run.status == PENDING)
        | ((run.status == FAILED) & attempts_left)
        | (lease_expired(run, cutoff) & attempts_left)
    )


def held(run: Any, host: str | None) -> Any:
    """Running (held by `host`, if given): what heartbeat, fail and release act on."""
    running = run.status == RUNNING
    return running if host is None else running & (run.host == host)


def unfinished(run: Any) -> Any:
    """Not done: done is final."""
    return run.status != DONE


def resettable(run: Any) -> Any:
    """Failed: what `reset_failed` gives a fresh attempt budget."""
    return run.status == FAILED


# -- what a transition writes ------------------------------------------------------------------


def claimed(run: Any, host: str, at: datetime) -> dict[str, Any]:
    return {"status": RUNNING, "attempts": run.attempts + 1, "host": host,
            "started_at": at, "heartbeat_at": at, "finished_at": None}


def renewed(at: datetime) -> dict[str, Any]:
    return {"heartbeat_at": at}


def finished(at: datetime) -> dict[str, Any]:
    return {"status": DONE, "finished_at": at, "heartbeat_at": None, "error": None}


def failed(error: str, at: datetime) -> dict[str, Any]:
    return {"status": FAILED, "error": error, "finished_at": at, "heartbeat_at": None}


def released(run: Any) -> dict[str, Any]:
    """Back to pending, the attempt given back (claim counted it; a running run has >= 1)."""
    return {"status": PENDING, "attempts": run.attempts - 1, "host": None,
            "started_at": None, "heartbeat_at": None}


RESET = {"attempts": 0}
"""What `reset_failed` writes to a failed run."""


# -- what goes in ------------------------------------------------------------------------------


def unique_runs(runs: Sequence[RunSpec]) -> list[RunSpec]:
    """`runs` without repeated run ids (a run listed twice is added once)."""
    return list({run.run_id: run for run in runs}.values())


def new_run(run: RunSpec, at: datetime) -> dict[str, Any]:
    """A `Run` row's values for a run the ledger did not have."""
    return {
        "run_id": run.run_id,
        "cell_key": run.cell_key,
        "factors": dict(run.factors),
        "seed": run.seed,
        "config": run.config,
        "status": PENDING,
        "attempts": 0,
        "created_at": at,
    }


def stored_result(result: dict[str, Any]) -> dict[str, Any]:
    """The `Result` columns of `result`, checked before anything is written: TypeError for a value
    JSON cannot hold, ValueError for unknown keys or metrics that are not a non-empty mapping of
    numbers (`ledger_values.result_values`)."""
    to_json(result)
    return result_values(result)


def malformed(result: Any) -> str | None:
    """Why a stored `Result` row is not a finished run's result (None if it is): stored before the
    check at `finish` existed. Such a run is never counted as done: reads show it failed, and
    `reopen_malformed` gives it back to pending. A done run with no `Result` row at all (a hand
    edit) is malformed too."""
    if result is None:
        return "the run is marked done but has no stored result"
    return result_problem({"metrics": result.metrics, "eval_curve": result.eval_curve, "signals": result.signals,
                           **{key: getattr(result, key) for key in COUNTS}})


def malformed_error(problem: str) -> str:
    return f"its stored result is unusable ({problem}); `dapo-ablate run` trains it again"


def reopened_error(problem: str) -> str:
    """The error text `reopen_malformed` leaves on a run it put back to pending."""
    return f"its stored result was unusable ({problem}) and was removed; the run trains again"


def reopened(problem: str) -> dict[str, Any]:
    """What `reopen_malformed` writes to a done run whose stored result is unusable (its result
    goes): pending, with a fresh attempt budget and why."""
    return {"status": PENDING, "attempts": 0, "host": None, "started_at": None, "finished_at": None,
            "heartbeat_at": None, "error": reopened_error(problem)}


# -- what comes out ----------------------------------------------------------------------------


def count_by_status(found: Mapping[str, int]) -> dict[str, int]:
    """Status -> number of runs, every status present (zeros included)."""
    return {status: found.get(status, 0) for status in RUN_STATUSES}


def runs_table_row(run: Any, result: Any | None) -> dict[str, Any]:
    """A `Run` row (and its `Result`, None until done) as `runs_table` returns it; a done run whose
    stored result is unusable (`malformed`) shows as failed, with why."""
    problem = malformed(result) if result is not None or run.status == DONE else None
    if problem is not None:
        result = None
    return {
        "run_id": run.run_id,
        "cell_key": run.cell_key,
        "factors": run.factors,
        "seed": run.seed,
        "status": FAILED if problem else run.status,
        "attempts": run.attempts,
        "error": malformed_error(problem) if problem else run.error,
        "host": run.host,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "heartbeat_at": run.heartbeat_at,
        "wall_s": result.wall_s if result else None,
        "metrics": result.metrics if result else None,
        "mlflow_run_id": run.mlflow_run_id,
        "job_id": run.job_id,
    }


def usable(result: Any | None) -> bool:
    """A stored result that `results` returns (one that is `malformed` is left out)."""
    return result is not None and malformed(result) is None


def results_row(run: Any, result: Any) -> dict[str, Any]:
    """A done `Run` row and its `Result` as `results` returns them."""
    return {
        "run_id": run.run_id,
        "cell_key": run.cell_key,
        "factors": run.factors,
        "seed": run.seed,
        "metrics": result.metrics,
        "eval_curve": result.eval_curve,
        "signals": result.signals,
        "tokens_generated": result.tokens_generated,
        "tokens_discarded": result.tokens_discarded,
        "wall_s": result.wall_s,
        "mlflow_run_id": run.mlflow_run_id,
    }


# -- an adaptive experiment's looks ----------------------------------------------------------------
def look_record(record: dict[str, Any]) -> dict[str, Any]:
    """A look's record as stored: a JSON mapping (TypeError if JSON cannot hold it)."""
    if not isinstance(record, dict):
        raise ValueError(f"a look's record must be a mapping, not {type(record).__name__}")
    return json.loads(to_json(record))


def check_look_number(name: str, number: int, last: int) -> None:
    """Looks are numbered 1, 2, ... without gaps: `number` may repeat the last (a race another
    driver won) or follow it."""
    if not last <= number <= last + 1 or number < 1:
        raise ValueError(f"look {number} of experiment {name!r} does not follow look {last}")


def look_row(number: int, recorded_at: datetime, record: dict[str, Any], name: str = "", url: str = "") -> dict[str, Any]:
    """A stored look as `Ledger.looks` returns it; LedgerError naming it when its record is not a
    mapping (a row edited by hand: this ledger stores only mappings)."""
    if not isinstance(record, dict):
        raise unreadable_look(url, name, number, f"its record is a {type(record).__name__}, not a mapping")
    return {"number": number, "recorded_at": recorded_at, **record}


def unreadable_look(url: str, name: str, number: int, why: str) -> LedgerError:
    """Look `number` of experiment `name` holds what no driver wrote (edited by hand), and the fix."""
    return LedgerError(
        f"the ledger at {url} holds look {number} of experiment {name!r} that does not read ({why[:160]}): a row edited "
        f"outside dapo-ablate; restore the ledger from a copy, or delete look {number} and the looks after it "
        "(table looks) and `run` again: the looks are made again from the finished runs"
    )
