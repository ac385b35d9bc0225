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

import importlib
import logging
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from dapo_ablate.ablation.runtime.cell import run_cell
from dapo_ablate.ablation.store.ledger import DONE, Ledger, RUNNING, connect_ledger
from dapo_ablate.ablation.runtime.ray_connect import RayConnectError, join_cluster
from dapo_ablate.ablation.runtime.preflight import (  # noqa: F401 - re-exported: executor's checks live there
    ExecutorError,
    check_database,
    check_ray_address,
    check_tracking_store,
    check_writable_folder,
    preflight,
)
from dapo_ablate.ablation.runtime.pool import KEPT_RESULT  # noqa: F401 - re-exported
from dapo_ablate.ablation.runtime.reaper import _start_time, descendants, start_reaper
from dapo_ablate.ablation.store.tracking import Tracker, sqlite_path

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

CELL_FN_ENV = "DAPO_ABLATE_CELL_FN"
"""Test/debug hook: ``module:function`` replacing `run_cell` as every task's body."""
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
"""A local Ray's object store: results are small dicts, so a small store keeps memory free."""
INTERRUPTED_EXIT = 130
TERMINATED_EXIT = 143  # 128 + SIGTERM, what schedulers and `kill` expect
_ERROR_CHARS = 2000


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

    @property
    def exit_code(self) -> int:
        """0 when every run of the plan is done; 130 after Ctrl-C; 1 otherwise."""
        if self.interrupted:
            return TERMINATED_EXIT if self.terminated else INTERRUPTED_EXIT
        return 0 if self.counts.get(DONE, 0) == sum(self.counts.values()) else 1


def run_experiment(
    spec: ExperimentSpec,
    plan: Plan,
    *,
    address: str | None = None,
    cell_fn: Callable[..., dict[str, Any]] | None = None,
    progress: bool = True,
    max_concurrent: int | None = None,
    retry_failed: bool = False,
) -> ExperimentSummary:
    """Run every run of `plan` that is not done yet; see the module docstring for the steps.

    address: Ray cluster to join (overrides ``executor.address``); None: the spec's, else a
    local Ray (reused if this process already started one). max_concurrent overrides
    ``executor.max_concurrent``. Raises ExecutorError / LedgerError for a user's mistake
    before writing anything, and `Interrupted` for a Ctrl-C or SIGTERM before the driver started.
    """
    address = address if address is not None else spec.executor.address
    fn = resolve_cell_fn(cell_fn)
    with sigterm_as_interrupt() as stop:
        started_ray = False
        try:
            preflight(spec, address)
            # A database server is checked before Ray starts; a SQLite ledger is only created after.
            ledger = None if sqlite_path(spec.ledger) else connect_ledger(spec.ledger)
            started_ray = connect_ray(address, spec)
            stop.check()  # a Ctrl-C that Ray's start-up swallowed (see _SigtermAsInterrupt)
        except (KeyboardInterrupt, SystemExit) as stopped:  # before the driver started: nothing was claimed or written
            raise stopped_at_start(stopped, stop, started_ray) from None
        stop.install()  # again: Ray's start-up puts its own SIGTERM handler (an abort) in place
        try:
            from dapo_ablate.ablation.runtime.driver import _Driver  # the driver imports this module's helpers

            driver = _Driver(spec, plan, fn, progress=progress, max_concurrent=max_concurrent, ledger=ledger,
                             local=not address, retry_failed=retry_failed, check_stop=stop.check)
            try:
                summary = driver.run()
            except KeyboardInterrupt:
                if driver.pool is not None:  # a second Ctrl-C as the driver ended: its runs were given back
                    raise
                # while the driver opened the ledger and MLflow (the experiment and its pending runs
                # may be recorded): without this, Typer's silent exit 130, even for a SIGTERM
                raise Interrupted(bool(stop.received), written=True) from None
            summary.terminated = bool(stop.received)
            return summary
        finally:
            if started_ray:
                import ray

                ray.shutdown()


def stopped_at_start(stopped: BaseException, stop: _SigtermAsInterrupt, started_ray: bool,
                     kind: type[Interrupted] | None = None) -> Interrupted:
    """The `Interrupted` (or `kind`) for a Ctrl-C or SIGTERM that came before a driver started,
    once the Ray it had started is shut down. A SystemExit is Ray's own SIGTERM handler (sys.exit,
    in place while ray.init runs) only with code 15; any other is raised again as it is."""
    by_ray = isinstance(stopped, SystemExit)
    if by_ray and stopped.code != signal.SIGTERM:
        raise stopped
    if started_ray:
        import ray

        ray.shutdown()
    return (kind or Interrupted)(bool(stop.received) or by_ray)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM before any run started (during the checks, Ray's start, or while the
    driver opened its stores: `written`): nothing was claimed or trained. `exit_code`: 130, or
    143 for SIGTERM."""

    def __init__(self, terminated: bool, written: bool = False) -> None:
        super().__init__("interrupted before any run started; nothing was run" + ("" if written else " or written"))
        self.exit_code = TERMINATED_EXIT if terminated else INTERRUPTED_EXIT


class _SigtermAsInterrupt:
    """SIGTERM, and Ctrl-C (SIGINT) where Python's default handler has it, raising
    KeyboardInterrupt in the main thread while installed, and remembered: `received` lists the
    SIGTERMs that came (the exit status is then 143), `signals` every stop signal.

    Remembered because a KeyboardInterrupt can be swallowed before it reaches the driver: a Ctrl-C
    landing while `import ray` initialises ray._raylet is raised inside Cython's set-up of that
    module, which discards it ("Exception ignored in: <module 'collections.abc'>", "Cython module
    failed to patch module with custom type"), and the driver then ran the whole experiment.
    `check()`, once Ray has started and at every step of the driver's loop, raises it again."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.signals: list[int] = []
        self.previous: dict[int, Any] = {}
        """Signal -> the handler in place before the first `install()`."""

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)
        if signum == signal.SIGTERM:
            self.received.append(signum)
        raise KeyboardInterrupt

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            current = signal.getsignal(signum)
            if signum == signal.SIGINT and current not in (signal.default_int_handler, self._on_signal):
                continue  # ignored (a background job: Ctrl-C is not for it) or the caller's own handler
            previous = signal.signal(signum, self._on_signal)
            self.previous.setdefault(signum, previous)

    def restore(self) -> None:
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)

    def check(self) -> None:
        """Raise KeyboardInterrupt if a stop signal came (its own KeyboardInterrupt may have been
        swallowed on the way)."""
        if self.signals:
            raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[_SigtermAsInterrupt]:
    """Within the block, SIGTERM is a clean cancel exactly like Ctrl-C: it raises
    KeyboardInterrupt in the main thread (runs in flight go back to pending, the summary is
    printed, the MLflow parent is KILLED; before the driver starts, `Interrupted`), and both are
    remembered for `check()`. Ray's start-up installs its own SIGTERM handler (which aborts the
    process with a stack dump): call ``install()`` again after it. Outside the main thread (no
    signals there) it does nothing."""
    stop = _SigtermAsInterrupt()
    stop.install()
    try:
        yield stop
    finally:
        stop.restore()


# ---------------------------------------------------------------------------------- checks
def resolve_cell_fn(cell_fn: Callable[..., dict[str, Any]] | None) -> Callable[..., dict[str, Any]]:
    """The given cell function, else ``$DAPO_ABLATE_CELL_FN`` (module:function), else `run_cell`."""
    if cell_fn is not None:
        return cell_fn
    target = os.environ.get(CELL_FN_ENV)
    if not target:
        return run_cell
    module, _, name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ExecutorError(f"{CELL_FN_ENV}={target!r} does not name a function ({err}); use module:function") from None
    return fn


def release_orphans(ledger: Ledger, experiment: str, host: str) -> int:
    """Runs of `experiment` left *running* by a dead driver process on this machine go back to
    pending now; how many. ``host`` is this driver's `this_host()` ("hostname:pid"): runs held by
    a live process, this one included, or by another machine are left alone (a lease handles those)."""
    hostname, _, own_pid = host.rpartition(":")
    released = 0
    for row in ledger.runs_table(experiment):
        holder, _, pid = (row["host"] or "").rpartition(":")
        if row["status"] == RUNNING and holder == hostname and pid.isdigit():
            if int(pid) != int(own_pid) and not pid_alive(int(pid)):
                released += ledger.release(row["run_id"], host=row["host"])
    return released


def connect_ray(address: str | None, spec: ExperimentSpec) -> bool:
    """Join `address`, or start a local Ray sized to this machine; True if this call started
    Ray (and so should shut it down). A Ray already initialised in this process is reused.
    A Ctrl-C while Ray is imported or starts is held back until it has started (`ctrl_c_held`)."""
    with ctrl_c_held():
        import ray

    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
    if address:
        try:  # with the cluster's token when it uses token authentication (ablation/ray_connect.py)
            with ctrl_c_held():
                join_cluster(address, spec.executor.auth_token_file, **quiet)
        except RayConnectError as err:
            raise ExecutorError(str(err)) from None
        return True
    cpus = os.cpu_count() or 1
    executor = spec.executor
    if executor.cpus_per_run > cpus:
        raise ExecutorError(
            f"executor.cpus_per_run ({executor.cpus_per_run:g}) exceeds this machine's {cpus} CPUs; lower it or join a cluster with --address"
        )
    # address="local": always a new Ray of our own; a bare ray.init() would join whatever cluster
    # Ray's current-cluster file names (a colleague's `ray start`, another driver's, a crashed one)
    before = _children_now()
    try:
        with ctrl_c_held():
            ray.init(address="local", num_cpus=cpus, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **quiet)
    except BaseException:  # Ctrl-C (once Ray started) or SIGTERM while Ray starts: stop what it has started
        _stop_interrupted_ray(before)
        raise
    start_reaper()  # the local Ray's processes die with this driver, even after a SIGKILL
    if executor.gpus_per_run > ray.cluster_resources().get("GPU", 0):
        ray.shutdown()
        raise ExecutorError(
            f"executor.gpus_per_run ({executor.gpus_per_run:g}) exceeds the GPUs Ray finds here; set it to 0 or join a GPU cluster with --address"
        )
    return True


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Within the block a Ctrl-C is held back and raised as the block ends (a second one
    interrupts at once). Ray cannot be interrupted safely while it is imported or starts: a
    KeyboardInterrupt inside ray.init's connect() leaves a half-built core worker whose io thread
    then crashes the driver (SIGSEGV in CoreWorker::RecordMetrics, after the "interrupted"
    sentence), and one while ray._raylet initialises is discarded by Cython. An ignored SIGINT (a
    background job) or one outside the main thread is left alone."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if held:
            raise KeyboardInterrupt
        held.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        previous(signal.SIGINT, None)  # the caller's handler: KeyboardInterrupt, remembered by a stop handler


def _children_now() -> set[tuple[int, int | None]]:
    """(pid, start time) of every process under this one (none known without /proc: macOS)."""
    if not os.path.isdir("/proc"):
        return set()
    me = os.getpid()
    return {(pid, _start_time(pid)) for pid in descendants([me]) if pid != me}


def _stop_interrupted_ray(before: set[tuple[int, int | None]]) -> None:
    """Stop what an interrupted ray.init had started. ray.shutdown() stops only what Ray had
    registered by then: the raylet's dashboard and runtime-env agents (about 200 MB) outlived
    it, orphaned, and the reaper is only started after ray.init. So every process started under
    this driver since ray.init began (`before`: the ones there already) is killed too."""
    import ray

    started = _children_now() - before  # now: the agents are the raylet's children until it dies
    ray.shutdown()
    for pid, start in started:
        if start is not None and _start_time(pid) == start:  # never a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def this_host() -> str:
    """The ledger's holder string of this driver: ``hostname/pidns-<id>:pid``. The PID namespace
    keeps containers that share a hostname (and a PostgreSQL ledger) from judging each other's
    pids: only a holder in this very namespace is checked for liveness."""
    return f"{socket.gethostname()}/pidns-{_pid_namespace()}:{os.getpid()}"


def _pid_namespace() -> str:
    try:
        return "".join(ch for ch in os.readlink("/proc/self/ns/pid") if ch.isdigit()) or "0"
    except OSError:  # no procfs (macOS): pids are the machine's
        return "0"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def describe_error(err: BaseException) -> str:
    """One line for the ledger: ``Type: message (at file:line in function)``; for an error
    raised inside a task, the type, message and last frame of the remote traceback."""
    from ray.exceptions import RayTaskError

    cause, where = err, ""
    if isinstance(err, RayTaskError):
        # Ray raises a subclass of both RayTaskError and the cause's type; str() holds the
        # remote traceback.
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', str(err))
        if frames:
            path, line, function = frames[-1]
            where = f" (at {Path(path).name}:{line} in {function})"
        inner = getattr(err, "cause", None)
        cause = inner if isinstance(inner, BaseException) else err
    lines = str(cause).strip().splitlines() if cause is not err or not isinstance(err, RayTaskError) else []
    message = lines[0].strip() if lines else ""
    text = f"{type(cause).__name__}: {message}" if message else type(cause).__name__
    return (text + where)[:_ERROR_CHARS]




def _execute(cell_fn: Callable[..., dict[str, Any]], config: dict[str, Any], run_dir: str, eval_cache_dir: str,
             events: Any = None, run_id: str = "", env: dict[str, str] | None = None) -> dict[str, Any]:
    """The Ray task of every run (`ablation.pool`): one run, with `env` set in its environment.
    A cell function taking ``on_event`` sends its training steps, evaluations and job ids to the
    driver through `events` (a Ray queue) while it trains (live MLflow, a sweep's pruner); one
    taking only ``on_eval`` sends its evaluations."""
    import inspect

    from dapo_ablate.ablation.runtime.quiet import silence_third_party_output

    silence_third_party_output()  # the driver's display owns the terminal
    os.environ.update(env or {})
    try:
        accepted = set(inspect.signature(cell_fn).parameters)
    except (TypeError, ValueError):
        accepted = set()
    if events is None or not accepted & {"on_event", "on_eval"}:
        return cell_fn(config, run_dir, eval_cache_dir)

    def on_event(kind: str, step: int, data: dict[str, Any]) -> None:
        try:
            events.put_nowait((run_id, kind, int(step), dict(data)))
        except Exception:  # noqa: BLE001 - a driver gone or a full queue never stops the training
            pass

    if "on_event" in accepted:
        return cell_fn(config, run_dir, eval_cache_dir, on_event=on_event)
    return cell_fn(config, run_dir, eval_cache_dir, on_eval=lambda step, metrics: on_event("eval", step, metrics))


def capacity(spec: ExperimentSpec, runs: int) -> int:
    """Runs that fit at once in the connected Ray cluster's CPUs and GPUs (at least 1; `runs`
    when a run declares no resources)."""
    import ray

    total = ray.cluster_resources()
    executor = spec.executor
    fits = [int(total.get("CPU", 1) // executor.cpus_per_run)] if executor.cpus_per_run > 0 else []
    if executor.gpus_per_run > 0:
        fits.append(int(total.get("GPU", 0) // executor.gpus_per_run))
    return max(1, min(fits, default=runs))


def open_tracker(uri: str, artifact_location: str | None, name: str) -> Tracker:
    """A `Tracker`, with a store that cannot be opened reported as one sentence."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return Tracker(uri, artifact_location, name)
    except (MlflowException, SQLAlchemyError, OSError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ExecutorError(f"could not open the MLflow tracking store at {uri} ({first}); check tracking.uri") from None
