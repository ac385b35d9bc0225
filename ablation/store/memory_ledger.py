"""A ledger that lives in this process: the `Ledger` contract (`ablation.store.ledger`) over plain
dicts, as Optuna's InMemoryStorage is over its RDB storage. Open it with ``connect_ledger("memory://")``.

For tests and for one-process uses that need no record afterwards: nothing is written anywhere,
and every `MemoryLedger` is a separate, empty ledger (``memory://`` names no shared place).

It applies the SQL ledger's own rules (`ablation.store.ledger_rules`) to rows that are instances of
the SQL ledger's own models (`Run`, `Result`, `Experiment`, never added to a session), so a row has
one definition and a state change one statement. Values go through the ledger's JSON serializer
(`to_json`) on the way in, so what comes back is what the SQL ledger returns: NaN as None, numpy
scalars as numbers, tuples as lists; every read returns copies. One lock makes each method one
transaction for the threads of this process.
"""

from __future__ import annotations

import copy
import json
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from sqlalchemy import JSON

from dapo_ablate.ablation.experiment.identity import RunSpec
from dapo_ablate.ablation.store import ledger_rules as rules
from dapo_ablate.ablation.store.ledger_models import DONE, Base, Experiment, Result, Run
from dapo_ablate.ablation.store.ledger_rules import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    ExperimentRecord,
)
from dapo_ablate.ablation.store.ledger_values import to_json

MEMORY_URL = "memory://"
"""The ledger URL `connect_ledger` answers with a new `MemoryLedger`."""

Row = TypeVar("Row", bound=Base)


class MemoryLedger:
    """A ledger in this process's memory (see the module docstring)."""

    def __init__(self) -> None:
        self.url = MEMORY_URL
        self._lock = threading.Lock()
        self._experiments: dict[str, Experiment] = {}
        self._members: dict[str, dict[str, None]] = {}  # experiment -> its run ids (an ordered set)
        self._runs: dict[str, Run] = {}
        self._results: dict[str, Result] = {}
        self._looks: dict[str, list[tuple[int, Any, dict[str, Any]]]] = {}  # experiment -> its looks

    def close(self) -> None:
        """Nothing to close; the ledger keeps its contents and can still be used."""

    def __enter__(self) -> MemoryLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MemoryLedger({len(self._experiments)} experiments, {len(self._runs)} runs)"

    # -- experiments ---------------------------------------------------------------------------

    def ensure_experiment(self, name: str, spec: dict[str, Any], digest: str | None = None) -> int:
        """Create experiment `name` or replace its spec; return its id. With `digest`: bind the
        name to it, or refuse another one (`LedgerError`, nothing written)."""
        with self._lock:
            found = self._experiments.get(name)
            if found is not None:
                if digest is not None and found.digest not in (None, digest):
                    raise rules.other_design(self.url, name, found.digest)
                found.spec = _stored(spec)
                found.digest = found.digest or digest
                return found.id
            values = {"id": len(self._experiments) + 1, "name": name, "spec": spec,
                      "created_at": rules.now(), "mlflow_parent_run_id": None, "digest": digest}
            self._experiments[name] = _row(Experiment, values)
            self._members[name] = {}
            return self._experiments[name].id

    def get_experiment(self, name: str) -> ExperimentRecord | None:
        with self._lock:
            row = self._experiments.get(name)
            if row is None:
                return None
            return ExperimentRecord(row.id, row.name, copy.deepcopy(row.spec), row.created_at,
                                    row.mlflow_parent_run_id, row.digest)

    def result_key(self, name: str) -> bytes:
        """The experiment's secret key for sealing kept results (32 bytes), created once."""
        with self._lock:
            self._members_of(name)
            row = self._experiments[name]
            row.result_key = row.result_key or secrets.token_hex(32)
            return bytes.fromhex(row.result_key)

    def set_mlflow_parent(self, name: str, mlflow_run_id: str) -> None:
        with self._lock:
            self._members_of(name)
            self._experiments[name].mlflow_parent_run_id = mlflow_run_id

    # -- runs ----------------------------------------------------------------------------------

    def add_runs(self, name: str, runs: Sequence[RunSpec]) -> int:
        """Record `runs` for experiment `name`; return how many were new to the ledger.

        Existing runs (same `run_id`, possibly added by another experiment) are only linked.
        """
        unique = rules.unique_runs(runs)
        at = rules.now()
        with self._lock:
            members = self._members_of(name)
            new = [run for run in unique if run.run_id not in self._runs]
            rows = [_row(Run, rules.new_run(run, at)) for run in new]  # all checked before any is kept
            self._runs.update((row.run_id, row) for row in rows)
            members.update(dict.fromkeys(run.run_id for run in unique))
        return len(new)

    def claimable(
        self,
        name: str,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> list[str]:
        """Run ids of `name` that `claim` would accept now, in (cell_key, seed) order."""
        cutoff = rules.lease_cutoff(rules.now(), lease_s)
        return self._run_ids_where(name, lambda run: rules.claimable(run, cutoff, max_attempts))

    def claim(
        self,
        run_id: str,
        host: str,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> bool:
        """Take `run_id` for `host`; True for exactly one of any racing threads."""
        at = rules.now()
        cutoff = rules.lease_cutoff(at, lease_s)
        return self._transition(run_id, lambda run: rules.claimable(run, cutoff, max_attempts),
                                lambda run: rules.claimed(run, host, at))

    def heartbeat(self, run_id: str, host: str | None = None) -> bool:
        """Renew the lease; False if the run is no longer running (for `host`, if given)."""
        at = rules.now()
        return self._transition(run_id, lambda run: rules.held(run, host), lambda _: rules.renewed(at))

    def finish(self, run_id: str, result: dict[str, Any]) -> bool:
        """Mark `run_id` done and store `result`; False (and nothing written) if already done."""
        at = rules.now()
        stored = _row(Result, {"run_id": run_id, "recorded_at": at, **rules.stored_result(result)})
        with self._lock:
            if not self._apply(run_id, rules.unfinished, lambda _: rules.finished(at)):
                return False
            self._results[run_id] = stored
            return True

    def fail(self, run_id: str, error: str, host: str | None = None) -> bool:
        """Record a failed attempt of a running run with its error text."""
        at = rules.now()
        return self._transition(run_id, lambda run: rules.held(run, host),
                                lambda _: rules.failed(error, at))

    def release(self, run_id: str, host: str | None = None) -> bool:
        """Put a running run back to pending and give its attempt back (used on Ctrl-C)."""
        return self._transition(run_id, lambda run: rules.held(run, host), rules.released)

    def reset_failed(self, name: str, run_ids: list[str]) -> int:
        """Give the failed runs among `run_ids` a fresh attempt budget; how many."""
        with self._lock:
            known = [self._runs[run_id] for run_id in set(run_ids) if run_id in self._runs]
            reset = [run for run in known if rules.resettable(run)]
            for run in reset:
                _update(run, rules.RESET)
            return len(reset)

    def reopen_malformed(self, name: str) -> list[str]:
        """Put the done runs of `name` whose stored result is unusable back to pending (see
        `SQLLedger.reopen_malformed`); their run ids."""
        with self._lock:
            reopened = []
            for run in self._runs_of(name):
                result = self._results.get(run.run_id)
                problem = rules.malformed(result) if run.status == DONE else None
                if problem is not None:
                    self._results.pop(run.run_id, None)
                    _update(run, rules.reopened(problem))
                    reopened.append(run.run_id)
            return reopened

    def expired_leases(self, name: str, *, lease_s: float = DEFAULT_LEASE_S) -> list[str]:
        """Run ids of `name` left running with a lease older than `lease_s` seconds."""
        cutoff = rules.lease_cutoff(rules.now(), lease_s)
        return self._run_ids_where(name, lambda run: rules.lease_expired(run, cutoff))

    def set_mlflow_run(self, run_id: str, mlflow_run_id: str) -> None:
        self._transition(run_id, _always, lambda _: {"mlflow_run_id": mlflow_run_id})

    def set_job_id(self, run_id: str, job_id: str | None) -> None:
        """Record the Ray job `run_id` runs as (None forgets it), whatever the run's state."""
        self._transition(run_id, _always, lambda _: {"job_id": job_id})

    # -- reading -------------------------------------------------------------------------------

    def counts(self, name: str) -> dict[str, int]:
        """Status -> number of runs of `name` (every status present, zeros included)."""
        with self._lock:
            return rules.count_by_status(Counter(run.status for run in self._runs_of(name)))

    def runs_table(self, name: str) -> list[dict[str, Any]]:
        """One dict per run of `name`, in (cell_key, seed) order (keys: `SQLLedger.runs_table`)."""
        with self._lock:
            rows = [rules.runs_table_row(run, self._results.get(run.run_id))
                    for run in self._runs_of(name)]
            return copy.deepcopy(rows)

    def results(self, name: str) -> list[dict[str, Any]]:
        """One dict per done run of `name`, in (cell_key, seed) order (keys: `SQLLedger.results`)."""
        with self._lock:
            done = [(run, self._results.get(run.run_id)) for run in self._runs_of(name)]
            return copy.deepcopy([rules.results_row(run, result) for run, result in done if rules.usable(result)])

    # -- internals (the lock held) -------------------------------------------------------------

    def record_look(self, name: str, number: int, record: dict[str, Any]) -> bool:
        """Store look `number` of experiment `name` once (see `SQLLedger.record_look`)."""
        stored = rules.look_record(record)
        with self._lock:
            self._members_of(name)
            looks = self._looks.setdefault(name, [])
            rules.check_look_number(name, number, len(looks))
            if number <= len(looks):
                return False
            looks.append((number, rules.now(), stored))
            return True

    def looks(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            self._members_of(name)
            return [rules.look_row(n, at, copy.deepcopy(record), name, self.url) for n, at, record in self._looks.get(name, [])]

    def _members_of(self, name: str) -> dict[str, None]:
        if name not in self._members:
            raise rules.no_experiment(self.url, name)
        return self._members[name]

    def _runs_of(self, name: str) -> list[Run]:
        runs = [self._runs[run_id] for run_id in self._members_of(name)]
        return sorted(runs, key=attrgetter(*rules.RUN_ORDER))

    def _run_ids_where(self, name: str, condition: Callable[[Run], bool]) -> list[str]:
        with self._lock:
            return [run.run_id for run in self._runs_of(name) if condition(run)]

    def _transition(self, run_id: str, guard: Callable[[Run], bool],
                    values: Callable[[Run], dict[str, Any]]) -> bool:
        with self._lock:
            return self._apply(run_id, guard, values)

    def _apply(self, run_id: str, guard: Callable[[Run], bool],
               values: Callable[[Run], dict[str, Any]]) -> bool:
        """The memory form of a guarded UPDATE of one run: True if `guard` held and the run took
        `values(run)`. Unknown run -> KeyError."""
        run = self._runs.get(run_id)
        if run is None:
            raise rules.no_run(run_id)
        if not guard(run):
            return False
        _update(run, values(run))
        return True


def _always(_: Run) -> bool:
    return True


def _update(row: Base, values: dict[str, Any]) -> None:
    for column, value in values.items():
        setattr(row, column, value)


def _stored(value: Any) -> Any:
    """`value` as the ledger's JSON columns give it back (a copy; TypeError if JSON cannot hold it)."""
    return json.loads(to_json(value))


def _row(model: type[Row], values: dict[str, Any]) -> Row:
    """A `model` row (never in a session) of `values`, its JSON columns stored as the SQL ledger
    stores them."""
    json_columns = {column.key for column in model.__table__.columns if isinstance(column.type, JSON)}
    return model(**{key: _stored(value) if key in json_columns else value
                    for key, value in values.items()})
