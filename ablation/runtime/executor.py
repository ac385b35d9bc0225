"""Run an experiment's plan on Ray, recording every run in the ledger and MLflow.

`run_experiment(spec, plan)` is what ``dapo-ablate run`` does:

1. check everything a user can get wrong (output folder, database folders, Ray address, cell
   function, every context, what each run's backend needs: `backends.registry`) before anything
   is written; connect to Ray (a local one by default); record the
   resolved spec in the experiment's folder (`record_spec`: OUTPUT_DIR/NAME/spec.yaml, overrides
   applied). A rerun of a finished experiment (every planned run done in the ledger, with a
   FINISHED MLflow child run, the ledger's spec the same but for `executor`) starts no Ray:
   `rerun_finished` closes it in seconds;
2. open MLflow's store (created here, once, before any task starts), record the experiment and
   its runs in the ledger (existing runs are kept, so a rerun, or a spec with added seeds or
   factors, only adds what is new) and find or create the MLflow parent run;
3. give back runs a dead driver on this host left *running* (its pid is gone) without waiting
   for their lease, and log to MLflow any finished run it had not logged yet;
4. claim and submit claimable runs as Ray tasks, at most ``max_concurrent`` at a time, each
   declaring ``cpus_per_run``/``gpus_per_run``; heartbeat their leases while they run; record
   each result (kept on disk, then the ledger, then its MLflow child run) or failure (its error
   text), retrying a failed run until it has had ``executor.retries + 1`` attempts in all,
   counted across invocations (``run --retry-failed`` gives failed runs a fresh budget), when its
   backend says the failure is worth another (`Backend.retries`: a verl job that really failed is
   not); a run past its time limit (``executor.run_timeout_s``; a verl cell's own:
   `Backend.time_limits`) is cancelled and failed (a verl cell's job then resubmitted);
5. on Ctrl-C or SIGTERM, cancel the tasks in flight and put their runs back to pending (exit 130,
   143).

Only this driver process writes the ledger and MLflow; a task only trains and returns a dict.
A task's body is a *cell function* (`cell.run_cell` by default). For tests and debugging the
environment variable ``DAPO_ABLATE_CELL_FN=module:function`` substitutes another one (the
module must be importable by the driver and by the Ray workers, e.g. through PYTHONPATH). It
replaces only how a run executes: the checks (contexts, each run's `Backend`) are the same.

On a cluster, ``output_dir`` (run folders with checkpoints, the shared step-0 evaluation cache)
must be a path every node sees, e.g. a shared filesystem.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import yaml

from dapo_ablate.core.atomic import UnreadableFile, own_folder, read_regular
from dapo_ablate.core.config import ConfigError

from dapo_ablate.ablation.experiment.spec import ExperimentSpec, SpecError, load_spec_file, run_root, validate_spec
from dapo_ablate.ablation.runtime.adaptive import LookPolicy
from dapo_ablate.ablation.runtime.experiment_run import ExperimentRun
from dapo_ablate.ablation.runtime.factorial import ExperimentSummary, RunOptions
from dapo_ablate.ablation.runtime.backends.registry import check_backends
from dapo_ablate.ablation.runtime.preflight import check_contexts, preflight
from dapo_ablate.ablation.runtime.ray_connect import connect_ray
from dapo_ablate.ablation.runtime.signals import Interrupted, StopSignals, sigterm_as_interrupt, stopped_at_start
from dapo_ablate.ablation.runtime.task import resolve_cell_fn
from dapo_ablate.ablation.store.adaptive_state import adaptive_state
from dapo_ablate.ablation.store.binding import check_binding, check_folder, experiment_digest
from dapo_ablate.ablation.store.ledger import DONE, FAILED, PENDING, RUNNING, Ledger, LedgerError, connect_ledger
from dapo_ablate.ablation.store.results import open_ledger
from dapo_ablate.ablation.store.tracking import Tracker, absolute_tracking_uri, default_artifact_location, open_tracker, sqlite_path
from dapo_ablate.ablation.store.transient import MLFLOW, Retrying

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan

__all__ = ["SPEC_RECORD", "SWEEP_RECORD", "ExperimentSummary", "RunOptions", "located", "record_name", "record_spec",
           "rerun_finished", "run_experiment", "session"]
T = TypeVar("T")

SPEC_RECORD = "spec.yaml"
"""An experiment's resolved spec (overrides applied, every default explicit, stores by absolute
path), written into its folder OUTPUT_DIR/NAME by every `run` before any run starts, as Hydra
keeps `.hydra/config.yaml`: `status`, `report` and `ui` take that folder in place of the spec and
its overrides."""
SWEEP_RECORD = "sweep.yaml"
MAX_RECORD_BYTES = 16 * 2**20
"""A record larger than this is not read for its name."""
"""A sweep's resolved spec, in its folder OUTPUT_DIR/NAME (`sweep-report` takes the folder)."""
RECORD_HEADER = (
    "# The {kind} `dapo-ablate {command}` last ran in this folder: its spec with the command line's overrides\n"
    "# applied, every default explicit and the stores by absolute path (written before any run started).\n"
    "# `dapo-ablate {readers} {folder}` read it; so does `dapo-ablate {command} {folder}` (to rerun it).\n"
)


def run_experiment(spec: ExperimentSpec, plan: Plan, *, address: str | None = None,
                   cell_fn: Callable[..., dict[str, Any]] | None = None, options: RunOptions | None = None,
                   policy: LookPolicy | None = None, origin: dict[str, Any] | None = None) -> ExperimentSummary:
    """Run every run of `plan` that is not done yet; see the module docstring for the steps.
    design: adaptive: `plan` is the plan as it stands (`store.adaptive_state.current_plan`) and
    `policy` makes its looks (`runtime.adaptive`); the experiment grows until a look stops it.

    address: Ray cluster to join (overrides ``executor.address``); None: the spec's, else a
    local Ray (reused if this process already started one). options: a progress bar or lines,
    a concurrency limit over ``executor.max_concurrent``, failed runs given a fresh budget
    (`RunOptions`; its `local` is set from the address here). Raises ExecutorError /
    LedgerError for a user's mistake before writing anything, and `Interrupted` for a Ctrl-C or
    SIGTERM before the driver started. `origin`: where the spec came from, recorded beside it
    (`record_origin`).
    """
    address = address if address is not None else spec.executor.address
    fn = resolve_cell_fn(cell_fn)
    check_contexts(spec)  # a prompt + response ceiling beyond a model's context fails every run
    check_backends(spec, plan)  # e.g. a verl run verl cannot do: whatever cell function executes the runs
    finished = rerun_finished(spec, plan, address, origin)
    if finished is not None:
        return finished
    check_name_binding(spec)  # a name bound to another design is refused before Ray starts, and writes nothing
    # a database server is checked before Ray starts; a SQLite ledger is only created after
    open_first = lambda: None if sqlite_path(spec.ledger) else connect_ledger(spec.ledger)  # noqa: E731
    # the spec is recorded by the experiment's owner once the ledger and MLflow accept it (`ExperimentRun.record`)
    with session(spec, address, open_first=open_first, checked=True, record=False) as (stop, ledger):
        options = replace(options or RunOptions(), local=not address)
        if spec.design == "adaptive" and policy is None:
            raise TypeError("design: adaptive needs a look policy (runtime.adaptive.LookPolicy)")
        life = ExperimentRun(spec, plan, fn, options, ledger=ledger, check_stop=stop.check,
                             policy=policy if spec.design == "adaptive" else None)
        life.record = lambda: record_spec(spec, origin)
        try:
            summary = life.run()
        except KeyboardInterrupt:
            if life.pool is not None:  # a second Ctrl-C as the driver ended: its runs were given back
                raise
            # while the driver opened the ledger and MLflow (the experiment and its pending runs
            # may be recorded): without this, Typer's silent exit 130, even for a SIGTERM
            raise Interrupted(bool(stop.received), written=True) from None
        summary.terminated = bool(stop.received)
        return summary


@contextmanager
def session(spec: Any, address: str | None, *, open_first: Callable[[], T] = lambda: None,
            interrupted: type[Interrupted] = Interrupted, checked: bool = False,
            record: bool = True) -> Iterator[tuple[StopSignals, T]]:
    """What every driver (a factorial's, a sweep's) runs inside: the checks (`preflight`), then
    `open_first()` (a database server opened before Ray starts, so its mistake is reported at
    once; its value is yielded), then Ray (joined, or a local one started and shut down at the
    end), then (`record`) the resolved spec recorded in its folder (`record_spec`), with Ctrl-C and
    SIGTERM as one clean cancel (`signals`). A stop before the block starts raises `interrupted`
    (nothing was run). `checked`: `preflight` passed just before (it is not run twice). An
    experiment's driver records its spec itself (``record=False``), once its stores have accepted
    it: a spec its name's binding refuses must leave the folder's record as it was."""
    with sigterm_as_interrupt() as stop:
        started_ray = False
        try:
            if not checked:
                preflight(spec, address)
            opened = open_first()
            started_ray = connect_ray(address, spec)
            stop.check()  # a Ctrl-C that Ray's start-up swallowed (see signals.StopSignals)
        except (KeyboardInterrupt, SystemExit) as stopped:  # before the driver started: nothing was claimed or written
            raise stopped_at_start(stopped, stop, started_ray, interrupted) from None
        stop.install()  # again: Ray's start-up puts its own SIGTERM handler (an abort) in place
        try:
            try:  # after every check, Ray's refusals included (a mistake writes nothing), before any run
                if record:
                    record_spec(spec)
            except KeyboardInterrupt:
                raise interrupted(bool(stop.received)) from None
            yield stop, opened
        finally:
            if started_ray:
                import ray

                ray.shutdown()


# ----------------------------------------------------------------------- a finished experiment
def rerun_finished(spec: ExperimentSpec, plan: Plan, address: str | None,
                   origin: dict[str, Any] | None = None) -> ExperimentSummary | None:
    """A rerun of a finished experiment, without Ray: when the ledger shows every planned run done
    and MLflow a FINISHED child run for each, the checks pass, the spec is recorded (its folder,
    the ledger, the parent's spec.json), the parent run is marked FINISHED and the summary comes
    back, as the driver would give it, in seconds instead of Ray's start-up. None when a run is
    left to do or to log to MLflow (the driver's way then does both); `Interrupted` for a Ctrl-C
    or SIGTERM."""
    started = time.time()
    with sigterm_as_interrupt() as stop:
        try:
            preflight(spec, address)
            ledger = open_ledger(spec)
            if ledger is None:
                return None
            with ledger:
                found = _finished_and_logged(spec, plan, ledger)
                if found is None:
                    return None
                records, parent_id, tracker = found
                record_spec(spec, origin)
                ledger.ensure_experiment(spec.name, spec.to_dict())
            Retrying(tracker, MLFLOW).log_dict(parent_id, spec.to_dict(), "spec.json", doing="log the spec")
            Retrying(tracker, MLFLOW).end_parent(parent_id, "FINISHED", doing="end the MLflow parent run")
        except KeyboardInterrupt:
            raise Interrupted(bool(stop.received), written=True) from None
    print(f"{spec.name}: 0 runs to do, {len(records)} done before (each logged to MLflow; Ray not started)", flush=True)
    counts = {PENDING: 0, RUNNING: 0, DONE: len(records), FAILED: 0}
    return ExperimentSummary(spec.name, counts, already_done=len(records), wall_s=time.time() - started,
                             records=records, parent_run_id=parent_id)


def _finished_and_logged(spec: ExperimentSpec, plan: Plan, ledger: Ledger
                         ) -> tuple[list[dict[str, Any]], str, Tracker] | None:
    """(the plan's result records in plan order, the MLflow parent run id, its tracker) when every
    planned run is done in the ledger and has a FINISHED child under the parent; else None."""
    experiment = ledger.get_experiment(spec.name)
    if experiment is None or experiment.mlflow_parent_run_id is None or not _same_spec(experiment.spec, spec):
        return None
    if spec.design == "adaptive" and not adaptive_state(spec, ledger).stopped:
        return None  # a look is still to make (the driver's way makes it)
    planned = [run.run_id for run in plan.runs]
    status = {row["run_id"]: row["status"] for row in ledger.runs_table(spec.name)}
    if any(status.get(run_id) != DONE for run_id in planned):
        return None
    tracking = spec.tracking
    location = tracking.artifact_location or default_artifact_location(tracking.uri, spec.output_dir)
    tracker = open_tracker(tracking.uri, location, spec.name)
    parent_id = experiment.mlflow_parent_run_id
    if not tracker.is_parent(parent_id) or not set(planned) <= set(tracker.finished_children(parent_id)):
        return None  # an id edited in the ledger goes the driver's way, which finds the parent again
    by_id = {record["run_id"]: record for record in ledger.results(spec.name)}
    return [by_id[run_id] for run_id in planned], parent_id, tracker


def _same_spec(stored: dict[str, Any], spec: ExperimentSpec) -> bool:
    """The ledger's spec of the experiment is this one, but for `executor` (how runs execute,
    which a finished experiment no longer needs) and where relative stores were named from:
    anything else (a design the name's binding would refuse, a new metric) goes the driver's way."""
    def comparable(data: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in located(data).items() if key != "executor"}

    return comparable(stored) == comparable(spec.to_dict())


def check_name_binding(spec: ExperimentSpec) -> None:
    """LedgerError when the spec's name is bound in its (existing) ledger to another design or is
    a sweep's (`store.binding`), or when its runs' folder holds another experiment's or sweep's
    record (two names, one folder: `check_folder`); reads only. The driver checks the ledger's
    binding again under its lock."""
    check_own_folder(spec)
    ledger = open_ledger(spec)
    if ledger is None:
        return
    with ledger:
        check_binding(ledger.get_experiment(spec.name), spec, ledger.url)


def check_own_folder(spec: Any) -> None:
    """LedgerError when the runs' folder of `spec` records another experiment's or sweep's runs
    (two names, one folder: `check_folder`); reads only."""
    folder = run_root(spec)
    check_folder(spec.name, folder, [recorded_name(folder / name) for name in (SPEC_RECORD, SWEEP_RECORD)])


def repair_record(folder: Path) -> str | None:
    """Restore an experiment folder's `SPEC_RECORD` that holds another design than the one its
    name is bound to in its ledger (a `run` refused for its binding rewrote it before 0.2): the
    ledger's spec of that name (the last one it accepted), with the record's stores, is written
    back. The sentence saying so, or None when the record is the bound design (or cannot be
    judged: no ledger, no such experiment, a record that does not load)."""
    path = folder / SPEC_RECORD
    try:
        recorded = load_spec_file(ExperimentSpec, path, kind="spec")
        ledger = open_ledger(recorded)
        if ledger is None:
            return None
        with ledger:
            bound = ledger.get_experiment(recorded.name)
    except (SpecError, ConfigError, LedgerError):
        return None
    if bound is None or bound.digest is None or bound.digest == experiment_digest(recorded) or "space" in bound.spec:
        return None
    stores = {key: getattr(recorded, key) for key in ("ledger", "output_dir")}
    data = {**bound.spec, **stores, "tracking": recorded.tracking.model_dump(mode="json")}
    executor = dict(data.get("executor") or {})
    if executor.get("run_timeout_s") == type(recorded.executor).model_fields["run_timeout_s"].default:
        executor.pop("run_timeout_s")  # the ledger's full dump makes the default explicit; the record keeps it unset
        data["executor"] = executor
    try:
        restored = validate_spec(ExperimentSpec, data, f"the ledger's spec of {recorded.name!r}")
    except (SpecError, ConfigError):
        return None
    if experiment_digest(restored) != bound.digest or run_root(restored).resolve() != folder.resolve():
        return None
    record_spec(restored)
    return (f"{path} held another spec than the one {recorded.name!r} is bound to in its ledger (a refused `run` of an "
            f"earlier version rewrote it); restored it from the ledger's record")


# ------------------------------------------------------------------------------- the record
def recorded_name(path: Path) -> str | None:
    """The name in the record at `path` (`record_spec`), or None where there is none to read (no
    file, a link, not a YAML mapping with a string name)."""
    try:
        data = yaml.safe_load(read_regular(path, MAX_RECORD_BYTES))
    except (UnreadableFile, yaml.YAMLError, RecursionError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def record_name(spec: Any) -> str:
    """The file a spec is recorded in inside its folder: `SPEC_RECORD` or, for a sweep, `SWEEP_RECORD`."""
    return SPEC_RECORD if isinstance(spec, ExperimentSpec) else SWEEP_RECORD


ORIGIN_RECORD = "origin.json"
"""Beside an experiment's `SPEC_RECORD`: where the spec it records came from (the spec file, the
command line's overrides, the base trainer file) and when it was run (`record_spec`'s `origin`),
so that a report of the folder can say what produced it."""


def record_origin(folder: Path, origin: dict[str, Any]) -> None:
    """`origin` (JSON-able) into ``folder/ORIGIN_RECORD``, whole, with the time it was recorded;
    a `run` of the folder itself (its record) keeps the origin already there."""
    from dapo_ablate.core.atomic import write_text

    path = folder / ORIGIN_RECORD
    if path.is_file() and Path(origin.get("spec") or "").resolve() in (folder.resolve(), (folder / SPEC_RECORD).resolve()):
        return
    write_text(path, json.dumps({**origin, "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1))


def read_origin(folder: Path) -> dict[str, Any]:
    """The folder's `ORIGIN_RECORD` ({} when absent or unreadable: an earlier version's folder).
    Anyone who can write the folder can write it, so it is read as `record_origin` writes it or
    not at all: a regular file (no link, FIFO or device) of at most `MAX_ORIGIN_BYTES`, JSON, and
    of its fields only the texts (the overrides a list of texts); anything else is left out."""
    try:
        data = json.loads(read_regular(folder / ORIGIN_RECORD, MAX_ORIGIN_BYTES).decode("utf-8"))
    except (UnreadableFile, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    origin = {key: value for key, value in data.items() if key in _ORIGIN_TEXTS and isinstance(value, str)}
    overrides = data.get("overrides")
    if isinstance(overrides, list) and all(isinstance(item, str) for item in overrides):
        origin["overrides"] = overrides
    return origin


MAX_ORIGIN_BYTES = 2**20
"""An origin record larger than this is not read (the ones `record_origin` writes are a few hundred bytes)."""
_ORIGIN_TEXTS = ("spec", "command", "trainer_file", "recorded")


def record_spec(spec: Any, origin: dict[str, Any] | None = None) -> Path:
    """Write the resolved spec (`record_data`) into its folder ``run_root(spec)`` as YAML, atomically
    (a reader sees the previous record or this one, whole), and `origin` beside it
    (`record_origin`); the record's path."""
    folder = own_folder(run_root(spec))  # a link planted as the runs' folder is replaced, never written through
    path = folder / record_name(spec)
    experiment = path.name == SPEC_RECORD
    header = RECORD_HEADER.format(kind="experiment" if experiment else "sweep", command="run" if experiment else "sweep",
                                  readers="status | report | ui" if experiment else "sweep-report", folder=folder)
    text = header + yaml.safe_dump(record_data(spec), sort_keys=False, allow_unicode=True, width=120)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if origin is not None:
        record_origin(folder, origin)
    return path


def record_data(spec: Any) -> dict[str, Any]:
    """The spec as its record holds it: its full dump (`to_dict`, every default explicit) with the
    stores `located`. A spec whose full dump does not load back as a spec (a sweep's `space`
    dumps None for the fields a range type refuses) keeps its non-default fields, its full trainer
    and its stores. An ``executor.run_timeout_s`` the spec left unset stays unset (a verl cell's
    limit then comes from its estimate, from the record as from the spec file)."""
    full = located(spec.to_dict())
    executor = getattr(spec, "executor", None)
    if executor is not None and not executor.run_timeout_given:
        full["executor"].pop("run_timeout_s", None)
    try:
        validate_spec(type(spec), full, "the recorded spec")
        return full
    except SpecError:
        kept = {key: full[key] for key in ("trainer", "ledger", "tracking", "output_dir") if key in full}
        return {**spec.model_dump(mode="json", exclude_defaults=True), **kept}


def located(data: dict[str, Any]) -> dict[str, Any]:
    """A spec's dump with its stores named so that a command started in any folder finds them:
    SQLite ledger and tracking paths and ``output_dir`` made absolute (they are relative to the
    folder the command was started in)."""
    out = dict(data)
    if "ledger" in out:
        out["ledger"] = absolute_tracking_uri(out["ledger"])
    if isinstance(out.get("tracking"), dict) and "uri" in out["tracking"]:
        out["tracking"] = {**out["tracking"], "uri": absolute_tracking_uri(out["tracking"]["uri"])}
    if "output_dir" in out:
        out["output_dir"] = str(Path(out["output_dir"]).expanduser().resolve())
    return out
