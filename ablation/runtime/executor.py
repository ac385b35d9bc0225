"""Run an experiment's plan on Ray, recording every run in the ledger and MLflow.

`run_experiment(spec, plan)` is what ``dapo-ablate run`` does:

1. check everything a user can get wrong (output folder, database folders, Ray address, cell
   function) before anything is written; connect to Ray (a local one by default);
2. open MLflow's store (created here, once, before any task starts), record the experiment and
   its runs in the ledger (existing runs are kept, so a rerun, or a spec with added seeds or
   factors, only adds what is new) and find or create the MLflow parent run;
3. give back runs a dead driver on this host left *running* (its pid is gone) without waiting
   for their lease, and log to MLflow any finished run it had not logged yet;
4. claim and submit claimable runs as Ray tasks, at most ``max_concurrent`` at a time, each
   declaring ``cpus_per_run``/``gpus_per_run``; heartbeat their leases while they run; record
   each result (kept on disk, then the ledger, then its MLflow child run) or failure (its error
   text), retrying a failed run until it has had ``executor.retries + 1`` attempts in all,
   counted across invocations (``run --retry-failed`` gives failed runs a fresh budget); a run
   past ``executor.run_timeout_s`` is cancelled and failed;
5. on Ctrl-C or SIGTERM, cancel the tasks in flight and put their runs back to pending (exit 130,
   143).

Only this driver process writes the ledger and MLflow; a task only trains and returns a dict.
A task's body is a *cell function* (`cell.run_cell` by default). For tests and debugging the
environment variable ``DAPO_ABLATE_CELL_FN=module:function`` substitutes another one (the
module must be importable by the driver and by the Ray workers, e.g. through PYTHONPATH).

On a cluster, ``output_dir`` (run folders with checkpoints, the shared step-0 evaluation cache)
must be a path every node sees, e.g. a shared filesystem.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from dapo_ablate.ablation.runtime.factorial import ExperimentSummary, FactorialScheduler, RunOptions
from dapo_ablate.ablation.runtime.preflight import preflight
from dapo_ablate.ablation.runtime.ray_connect import connect_ray
from dapo_ablate.ablation.runtime.signals import Interrupted, StopSignals, sigterm_as_interrupt, stopped_at_start
from dapo_ablate.ablation.runtime.task import resolve_cell_fn
from dapo_ablate.ablation.store.ledger import connect_ledger
from dapo_ablate.ablation.store.tracking import sqlite_path

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

__all__ = ["ExperimentSummary", "RunOptions", "run_experiment", "session"]
T = TypeVar("T")


def run_experiment(spec: ExperimentSpec, plan: Plan, *, address: str | None = None,
                   cell_fn: Callable[..., dict[str, Any]] | None = None, progress: bool = True,
                   max_concurrent: int | None = None, retry_failed: bool = False) -> ExperimentSummary:
    """Run every run of `plan` that is not done yet; see the module docstring for the steps.

    address: Ray cluster to join (overrides ``executor.address``); None: the spec's, else a
    local Ray (reused if this process already started one). max_concurrent overrides
    ``executor.max_concurrent``. Raises ExecutorError /
    LedgerError for a user's mistake before writing anything, and `Interrupted` for a Ctrl-C or
    SIGTERM before the driver started.
    """
    address = address if address is not None else spec.executor.address
    fn = resolve_cell_fn(cell_fn)
    # a database server is checked before Ray starts; a SQLite ledger is only created after
    open_first = lambda: None if sqlite_path(spec.ledger) else connect_ledger(spec.ledger)  # noqa: E731
    with session(spec, address, open_first=open_first) as (stop, ledger):
        options = RunOptions(progress, max_concurrent, retry_failed, local=not address)
        scheduler = FactorialScheduler(spec, plan, fn, options, ledger=ledger, check_stop=stop.check)
        try:
            summary = scheduler.run()
        except KeyboardInterrupt:
            if scheduler.pool is not None:  # a second Ctrl-C as the driver ended: its runs were given back
                raise
            # while the driver opened the ledger and MLflow (the experiment and its pending runs
            # may be recorded): without this, Typer's silent exit 130, even for a SIGTERM
            raise Interrupted(bool(stop.received), written=True) from None
        summary.terminated = bool(stop.received)
        return summary


@contextmanager
def session(spec: Any, address: str | None, *, open_first: Callable[[], T] = lambda: None,
            interrupted: type[Interrupted] = Interrupted) -> Iterator[tuple[StopSignals, T]]:
    """What every driver (a factorial's, a sweep's) runs inside: the checks (`preflight`), then
    `open_first()` (a database server opened before Ray starts, so its mistake is reported at
    once; its value is yielded), then Ray (joined, or a local one started and shut down at the
    end), with Ctrl-C and SIGTERM as one clean cancel (`signals`). A stop before the block starts
    raises `interrupted` (nothing was run)."""
    with sigterm_as_interrupt() as stop:
        started_ray = False
        try:
            preflight(spec, address)
            opened = open_first()
            started_ray = connect_ray(address, spec)
            stop.check()  # a Ctrl-C that Ray's start-up swallowed (see signals.StopSignals)
        except (KeyboardInterrupt, SystemExit) as stopped:  # before the driver started: nothing was claimed or written
            raise stopped_at_start(stopped, stop, started_ray, interrupted) from None
        stop.install()  # again: Ray's start-up puts its own SIGTERM handler (an abort) in place
        try:
            yield stop, opened
        finally:
            if started_ray:
                import ray

                ray.shutdown()
