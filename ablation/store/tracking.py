"""MLflow logging of an experiment: one MLflow experiment per spec, one parent run, one child
run per cell x seed, live while it trains.

Only the driver writes MLflow (Ray tasks never touch it). Creating a `Tracker` opens the store
once, before any task starts: several processes creating a fresh SQLite store at once race on
its schema (docs/stores.md).

Live: a child run is created RUNNING when its run starts (`start_child`), receives each
training step's signals and each evaluation as they happen (`log_event`, fed by the driver from
its workers' events), and ends FINISHED (`finish_child`), or FAILED / KILLED (`end_child`).

Idempotence, so that a rerun never duplicates anything:
  - the parent run is found again by the id the ledger recorded, else by its ``dapo.role`` tag;
  - a child run carries the ledger's run id as tag ``dapo.run_id`` from the moment it is created:
    there is one child per run id, and a resumed or retried run continues it; a (metric, step)
    already in the store is never logged again. A FINISHED child is reused as it is.

The experiment carries ``mlflow.experimentKind = custom_model_development`` (the UI's "Model
training" kind, not GenAI), set when it is created or first opened by this version; every run
carries the package version and source commit. What `dapo-ablate ui` serves and links to (the
runs table's saved view) is `store.runs_view`.

Names follow verl's (`dapo_ablate.ablation.store.metric_names`; the README's "Metric names" table).

Portable: a SQLite store's default artifact folder is ``mlartifacts/`` beside the database; a
store opened from another folder (a copied ``dapo-runs/``) has its recorded artifact locations
moved to its own folder first (`rebase_artifacts`), so it never writes into the original.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_ablate.ablation.store import metric_names as names
from dapo_ablate.ablation.store.database import with_psycopg_driver
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.tracking_probe import check_server_reachable, sqlite_path  # noqa: F401 - public here too
from dapo_ablate.core.contracts import COMPUTE_COLUMNS

ROLE_TAG = "dapo.role"
DIGEST_TAG = "dapo.spec_digest"
"""The parent run's tag holding the digest its experiment name is bound to (`store.binding`)."""
RUN_ID_TAG = "dapo.run_id"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag
NOTE_TAG = "mlflow.note.content"  # the run's description in the UI
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
"""MLflow 3's experiment kind of model training (its UI's ``CUSTOM_MODEL_DEVELOPMENT``)."""
VERSION_TAG = "dapo.version"
GIT_COMMIT_TAG = "mlflow.source.git.commit"
ARTIFACTS_DIR = "mlartifacts"
_PAGE = 1000
_ENTITIES_PER_BATCH = 1000  # MLflow's log_batch limits
_PARAMS_PER_BATCH = 100
_TAG_CHARS = 5000  # MLflow refuses tag values over 8000 characters (long ordering lists)


@dataclass(frozen=True)
class ChildRun:
    """Everything a child run shows: one cell x seed (`result` is empty until it finished)."""

    run_id: str
    """The ledger's run id (content hash)."""
    name: str
    """Readable name, e.g. ``GRPO s0`` or ``OF+CH+SP+TL+DS s0``."""
    factors: dict[str, int]
    """Factor name -> level (0/1)."""
    seed: int
    config: dict[str, Any]
    """The fully resolved trainer config."""
    result: dict[str, Any] = field(default_factory=dict)
    """The ledger's result: metrics, eval_curve, signals, tokens_generated, tokens_discarded, wall_s."""
    tags: dict[str, str] = field(default_factory=dict)
    """Extra tags, e.g. design, cell key, orderings containing the cell."""


class Tracker:
    """The MLflow experiment `experiment_name` in the store at `uri`.

    `artifact_location` applies when the experiment is created (None: the store's default; see
    `default_artifact_location` for what the executor passes).
    """

    def __init__(self, uri: str, artifact_location: str | None, experiment_name: str) -> None:
        quiet_mlflow()
        from mlflow import MlflowClient

        self.uri = normalize_tracking_uri(uri)
        rebase_artifacts(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._ensure_experiment(experiment_name, artifact_location)
        self.source_tags = source_tags()
        self._logged: dict[str, set[tuple[str, int]]] = {}
        """MLflow run id -> (metric, step) pairs already in the store (loaded on first touch)."""
        self._source: dict[str, str] = {}
        """MLflow run id -> verl's data source name of its evaluations."""

    # -- parent ---------------------------------------------------------------------------------

    def parent_run(self, known_id: str | None, *, name: str, tags: dict[str, str],
                   params: dict[str, Any] | None = None, digest: str | None = None) -> str:
        """The experiment's parent run id, reused if it exists, else created; marked RUNNING.

        `known_id`: the id recorded in the ledger (tried first). `tags` are (re)set every time;
        `params` are logged where the parent has no value for them yet (MLflow params are
        immutable: a rerun with added seeds keeps the first values; its description is current).
        `digest` (`store.binding`): the parent is bound to it (tag `DIGEST_TAG`); a parent bound
        to another one is refused (`check_parent`) before anything is written.
        """
        parent = self.check_parent(known_id, digest)
        if parent is None:
            parent = self.client.create_run(self.experiment_id, run_name=name, tags={ROLE_TAG: "parent"})
        parent_id = parent.info.run_id
        from mlflow.entities import Param

        new = [Param(key, _param_value(value)) for key, value in (params or {}).items()
               if key not in parent.data.params]
        for batch in [new[i:i + _PARAMS_PER_BATCH] for i in range(0, len(new), _PARAMS_PER_BATCH)]:
            self.client.log_batch(parent_id, params=batch)
        bound = {DIGEST_TAG: digest} if digest else {}
        self.client.log_batch(parent_id, tags=_tags({**self.source_tags, **tags, **bound}))
        self.client.update_run(parent_id, status="RUNNING")
        return parent_id

    def check_parent(self, known_id: str | None, digest: str | None) -> Any | None:
        """The experiment's parent run (by the ledger's `known_id`, else by its ``dapo.role`` tag),
        or None; reads only. With `digest`: ExecutorError if that parent is bound to another
        digest, or is a sweep's (another spec used this name in this MLflow store, e.g. through
        another ledger)."""
        parent = self._active_run(known_id) if known_id else None
        if parent is None or parent.data.tags.get(ROLE_TAG) != "parent":  # an id edited in the ledger: not trusted
            found = self._search(f"tags.`{ROLE_TAG}` = 'parent'")
            parent = found[0] if found else None
        if parent is None or digest is None:
            return parent
        tags = parent.data.tags
        if tags.get(DIGEST_TAG, digest) != digest or tags.get("dapo.kind") == "sweep":
            name = self.client.get_experiment(self.experiment_id).name
            raise ExecutorError(
                f"the MLflow experiment {name!r} at {self.uri} already holds a parent run made from another spec; "
                f"give this spec another name, e.g. `name: {name}-2` in the spec or `name={name}-2` on the command line"
            )
        return parent

    def is_parent(self, run_id: str) -> bool:
        """`run_id` is this experiment's parent run: active, in this MLflow experiment, tagged
        ``dapo.role = parent``. The ledger's record of the id can be edited by hand, so nothing is
        written to a run it names before this holds (another experiment's parent, a child)."""
        run = self._active_run(run_id)
        return run is not None and run.data.tags.get(ROLE_TAG) == "parent"

    def log_parent_metrics(self, parent_id: str, metrics: dict[str, float], step: int = 0) -> None:
        """Headline metrics on the parent (e.g. the full-vs-baseline gain and its interval); a
        metric whose latest value is already this one is not logged again (a rerun of a finished
        experiment adds nothing to its history). Retried through the store's blips."""
        from mlflow.entities import Metric

        from dapo_ablate.ablation.store.transient import MLFLOW, Retrying

        latest = Retrying(self.client, MLFLOW).get_run(parent_id, doing="read the MLflow parent run").data.metrics
        now = int(time.time() * 1000)
        numbers = {names.mlflow_safe(key): float(value) for key, value in metrics.items() if _is_number(value)}
        batch = [Metric(key, value, now, step) for key, value in numbers.items() if not _same_value(latest.get(key), value)]
        if batch:
            Retrying(self.client, MLFLOW).log_batch(parent_id, metrics=batch, doing="log the headline")

    def end_parent(self, parent_id: str, status: str) -> None:
        """Mark the parent FINISHED, FAILED or KILLED at the end of an invocation."""
        self.client.set_terminated(parent_id, status=status)

    def log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        self.client.log_dict(run_id, data, artifact_file)

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(run_id, local_dir, artifact_path)

    # -- children -------------------------------------------------------------------------------

    def finished_children(self, parent_id: str) -> dict[str, str]:
        """Ledger run id -> MLflow run id of the parent's FINISHED children (one query)."""
        runs = self._search(f"tags.`{PARENT_TAG}` = '{parent_id}' and attributes.status = 'FINISHED'")
        return {run.data.tags[RUN_ID_TAG]: run.info.run_id for run in runs if RUN_ID_TAG in run.data.tags}

    def start_child(self, parent_id: str, child: ChildRun) -> str:
        """The child run of `child.run_id`, RUNNING: created with its params and tags, or the
        existing one continued (a resumed or retried run). A FINISHED child is left as it is."""
        existing = self._child(parent_id, child.run_id)
        if existing is not None:
            self._complete(existing, child)
            if existing.info.status != "FINISHED":
                self.client.update_run(existing.info.run_id, status="RUNNING")
            self._source[existing.info.run_id] = names.eval_source(child.config)
            return existing.info.run_id
        return self._create_child(parent_id, child)

    def follow(self, mlflow_id: str, source: str, *, new: bool = False) -> None:
        """Log to an MLflow run this tracker did not create as a child (`train --tracking`'s run):
        its evaluations name `source`; a `new` run has no metrics to read back first."""
        self._source[mlflow_id] = source
        if new:
            self._logged[mlflow_id] = set()

    def source_of(self, mlflow_id: str) -> str:
        """The evaluation source a run's metric names carry (`metric_names.eval_source`)."""
        return self._source.get(mlflow_id, "builtin")

    def log_event(self, mlflow_id: str, kind: str, step: int, data: dict[str, Any]) -> int:
        """Log one training step's signals (`kind` "step") or one evaluation ("eval") live;
        pairs (metric, step) already in the store are skipped. How many metrics were logged."""
        source = self.source_of(mlflow_id)
        renamed = names.step_metrics(data) if kind == "step" else names.eval_metrics(data, source)
        return self.log_metrics(mlflow_id, [(key, value, int(step)) for key, value in renamed.items()])

    def finish_child(self, mlflow_id: str, child: ChildRun) -> None:
        """Log what the live events did not (all of it for a run trained by a driver that died,
        or by a cell function that streams nothing) and mark the child FINISHED."""
        self._source.setdefault(mlflow_id, names.eval_source(child.config))
        self.log_metrics(mlflow_id, list(result_points(child.result, self._source[mlflow_id])))
        self.client.set_terminated(mlflow_id, status="FINISHED")

    def end_child(self, mlflow_id: str, status: str) -> None:
        """Mark a child FAILED (its attempt failed), KILLED (interrupted; it continues on the
        next run) or SCHEDULED (waiting for a retry)."""
        if status == "SCHEDULED":
            self.client.update_run(mlflow_id, status=status)
        else:
            self.client.set_terminated(mlflow_id, status=status)

    def log_child(self, parent_id: str, child: ChildRun) -> str:
        """A finished run's child, logged completely: reused if FINISHED, else started or
        continued and finished. Its MLflow run id."""
        existing = self._child(parent_id, child.run_id)
        if existing is not None and existing.info.status == "FINISHED":
            self._complete(existing, child)
            return existing.info.run_id
        mlflow_id = self.start_child(parent_id, child)
        self.finish_child(mlflow_id, child)
        return mlflow_id

    def _child(self, parent_id: str, run_id: str) -> Any | None:
        """The parent's child of ledger run `run_id` (stores of older versions may hold several:
        a FINISHED one is preferred, the first created otherwise)."""
        runs = [run for run in self._search(f"tags.`{RUN_ID_TAG}` = '{run_id}'") if run.data.tags.get(PARENT_TAG) == parent_id]
        finished = [run for run in runs if run.info.status == "FINISHED"]
        return (finished or runs or [None])[0]

    def _create_child(self, parent_id: str, child: ChildRun) -> str:
        """A new child run: created with every tag (its run id tag among them) in one call, then
        its params and config artifact. A driver stopped in between leaves a child without them;
        whoever reuses it next completes it (`_complete`)."""
        run = self.client.create_run(self.experiment_id, tags=self._child_tags(parent_id, child), run_name=child.name)
        run_id = run.info.run_id
        self._logged[run_id] = set()
        self._source[run_id] = names.eval_source(child.config)
        self.log_params(run_id, _child_params(child))
        self.client.log_dict(run_id, child.config, "config.json")
        return run_id

    def _complete(self, existing: Any, child: ChildRun) -> None:
        """A reused child gets the params it lacks (MLflow params are immutable: present ones stay),
        its tags set again and, if any param was missing, its config artifact: a child created by
        a driver stopped before it logged them is whole again."""
        run_id = existing.info.run_id
        missing = {key: value for key, value in _child_params(child).items() if key not in existing.data.params}
        tags = self._child_tags(existing.data.tags.get(PARENT_TAG, ""), child)
        if any(existing.data.tags.get(key) != value for key, value in tags.items()):
            self.client.log_batch(run_id, tags=_tags(tags))
        if missing:
            self.log_params(run_id, missing)
            self.client.log_dict(run_id, child.config, "config.json")

    def _child_tags(self, parent_id: str, child: ChildRun) -> dict[str, str]:
        tags = {PARENT_TAG: parent_id, RUN_ID_TAG: child.run_id, ROLE_TAG: "child", **self.source_tags, **child.tags}
        return {key: str(value)[:_TAG_CHARS] for key, value in tags.items()}

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Log `params` (lists and dicts as JSON) to run `run_id`, in as few calls as MLflow allows."""
        from mlflow.entities import Param

        param_list = [Param(key, _param_value(value)) for key, value in params.items()]
        for batch_params, _ in _batches(param_list, []):
            self.client.log_batch(run_id, params=batch_params)

    def log_metrics(self, mlflow_id: str, points: list[tuple[str, Any, int]]) -> int:
        """Log the (metric, value, step) `points` that are numbers and not in the store yet (read
        once per run, then kept up to date); how many were logged."""
        from mlflow.entities import Metric

        logged = self._logged_pairs(mlflow_id)
        now = int(time.time() * 1000)
        batch = []
        for key, value, step in points:
            if _is_number(value) and (key, step) not in logged:
                logged.add((key, step))
                batch.append(Metric(key, float(value), now, step))
        for _, batch_metrics in _batches([], batch):
            self.client.log_batch(mlflow_id, metrics=batch_metrics)
        return len(batch)

    def _logged_pairs(self, mlflow_id: str) -> set[tuple[str, int]]:
        if mlflow_id not in self._logged:
            run = self.client.get_run(mlflow_id)
            self._logged[mlflow_id] = {
                (key, m.step) for key in run.data.metrics for m in self.client.get_metric_history(mlflow_id, key)
            }
        return self._logged[mlflow_id]

    # -- internals ------------------------------------------------------------------------------

    def _ensure_experiment(self, name: str, artifact_location: str | None) -> str:
        experiment = self.client.get_experiment_by_name(name)  # first touch creates the store
        if experiment is None:
            experiment_id = self.client.create_experiment(name, artifact_location=artifact_location)
        else:
            experiment_id = experiment.experiment_id
            if experiment.lifecycle_stage == "deleted":
                self.client.restore_experiment(experiment_id)
        if experiment is None or experiment.tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
            self.client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
        return experiment_id

    def _active_run(self, run_id: str) -> Any | None:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return None
        if run.info.lifecycle_stage != "active" or run.info.experiment_id != self.experiment_id:
            return None
        return run

    def _search(self, filter_string: str) -> list[Any]:
        runs: list[Any] = []
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id], filter_string, max_results=_PAGE, page_token=token,
                order_by=["attributes.start_time ASC"],
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs


def result_points(result: dict[str, Any], source: str) -> Iterator[tuple[str, Any, int]]:
    """(MLflow name, value, step) of a ledger result, each signal once: training signals and
    evaluations per step, then the final metrics that are not the last evaluation's and the
    compute totals at the last step. Non-numeric values are skipped by the caller."""
    last_step = 0
    for row in result.get("signals") or []:
        step = int(row.get("step", 0))
        last_step = max(last_step, step)
        yield from ((key, value, step) for key, value in names.step_metrics(row).items())
    for row in result.get("eval_curve") or []:
        step = int(row.get("step", 0))
        last_step = max(last_step, step)
        yield from ((key, value, step) for key, value in names.eval_metrics(row, source).items())
    totals = {key: result.get(key) for key in COMPUTE_COLUMNS}
    for key, value in {**(result.get("metrics") or {}), **totals}.items():
        yield names.final_name(key, source), value, last_step


def source_tags() -> dict[str, str]:
    """Package version and, from a git checkout, the source commit (``mlflow.source.git.commit``)."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    try:
        tags = {VERSION_TAG: version("dapo-ablate")}
    except PackageNotFoundError:
        tags = {VERSION_TAG: "unknown"}
    tags |= {"mlflow.source.name": "dapo-ablate", "mlflow.source.type": "LOCAL"}
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return tags
    commit = out.stdout.strip()
    if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", commit):
        tags[GIT_COMMIT_TAG] = commit
    return tags


def rebase_artifacts(uri: str) -> int:
    """A SQLite store opened from another folder than where it was written (a copied or moved
    ``dapo-runs/``): the recorded default artifact locations (``<old folder>/mlartifacts``) point
    into the original, so they are moved to ``mlartifacts/`` beside this database file. How many
    rows changed (0: nothing to do, another kind of store, or no store yet)."""
    import sqlite3

    path = sqlite_path(uri)
    if path is None or not path.is_file():
        return 0
    here = (path.resolve().parent / ARTIFACTS_DIR).as_uri()
    changed = 0
    with sqlite3.connect(str(path), timeout=30) as db:
        try:
            rows = db.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
        except sqlite3.OperationalError:  # not an MLflow store (yet)
            return 0
        for experiment_id, location in rows:
            old = (location or "").rstrip("/")
            if not old.startswith("file://") or not old.endswith("/" + ARTIFACTS_DIR) or old == here:
                continue
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (here, experiment_id))
            cursor = db.execute(
                "UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) WHERE experiment_id = ? AND artifact_uri LIKE ? || '/%'",
                (here, len(old) + 1, experiment_id, old),
            )
            changed += 1 + cursor.rowcount
    return changed


def metric_name(key: str) -> str:
    """An MLflow-legal metric name: ``avg@32`` -> ``avg_at_32`` (as verl's MLflow logger does)."""
    return names.mlflow_safe(key)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dict -> flat dotted keys, e.g. {"algorithm.eps_high": 0.28}."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def normalize_tracking_uri(uri: str) -> str:
    """A plain ``postgresql://`` URI uses the psycopg 3 driver (what dapo-ablate installs)."""
    return with_psycopg_driver(uri)


def absolute_tracking_uri(uri: str) -> str:
    """`uri` as any process on this machine can open it, whatever its working folder: a relative
    SQLite path made absolute (a Ray task or a job's entrypoint starts elsewhere)."""
    path = sqlite_path(uri)
    return f"sqlite:///{path.expanduser().resolve()}" if path is not None else uri


def default_artifact_location(uri: str, output_dir: str | Path) -> str | None:
    """Where a new experiment's artifacts go when the spec names no place.

    A SQLite store: ``mlartifacts/`` next to its database file (moved with it: `rebase_artifacts`); another database: ``mlartifacts/``
    in the output folder (MLflow's default would be ``./mlruns`` in whatever folder the driver
    was started from); an MLflow server: None, the server's own default.
    """
    path = sqlite_path(uri)
    if path is not None:
        return (path.resolve().parent / ARTIFACTS_DIR).as_uri()
    if uri.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres", "mysql", "mssql"):
        return (Path(output_dir).resolve() / "mlartifacts").as_uri()
    return None


def quiet_mlflow() -> None:
    """Silence the store's migration chatter (INFO lines on every fresh database), and the
    traceback MLflow logs for each database error it then raises (a full disk printed one per try,
    14 before the one sentence our retries end with, which names the error)."""
    for name in ("alembic", "mlflow.store.sqlalchemy", "mlflow.tracking"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def _child_params(child: ChildRun) -> dict[str, Any]:
    """A child run's params: factor levels, the resolved config (dotted), seed, run id, setting."""
    return {
        **{f"factor.{name}": level for name, level in child.factors.items()},
        **flatten(child.config),
        "seed": child.seed,
        "run_id": child.run_id,
        **({"setting": child.tags["dapo.setting"]} if "dapo.setting" in child.tags else {}),
    }


def _tags(tags: dict[str, str]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(key, str(value)[:_TAG_CHARS]) for key, value in tags.items()]


def _param_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)


def markdown_code(text: str) -> str:
    """`text` as one Markdown code span that nothing in it can end (MLflow renders a run's
    description as Markdown: a backtick in a name would close a plain span and let HTML after it
    through): fenced by one backtick more than its longest run of backticks, on one line."""
    text = " ".join(str(text).splitlines())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_text(text: str) -> str:
    """`text` as literal Markdown text: every ASCII punctuation character backslash-escaped (no
    emphasis, link, HTML tag or code span can start in it), on one line."""
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", " ".join(str(text).splitlines()))


def _same_value(latest: float | None, value: float) -> bool:
    """The parent's latest value of a metric is this one (NaN counts as the same as NaN)."""
    return latest is not None and (latest == value or (math.isnan(latest) and math.isnan(value)))


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not (isinstance(value, float) and math.isinf(value))


def _batches(params: list[Any], metrics: list[Any]) -> Iterator[tuple[list[Any], list[Any]]]:
    """(params, metrics) per `log_batch` call within MLflow's limits: at most 100 params and
    1000 entities per call. Each call is one store transaction, so fewer calls is faster."""
    while params or metrics:
        batch_params, params = params[:_PARAMS_PER_BATCH], params[_PARAMS_PER_BATCH:]
        room = _ENTITIES_PER_BATCH - len(batch_params)
        batch_metrics, metrics = metrics[:room], metrics[room:]
        yield batch_params, batch_metrics


def open_tracker(uri: str, artifact_location: str | None, name: str, hint: str = "check tracking.uri") -> Tracker:
    """A `Tracker`, with a store that cannot be opened reported as one sentence ending in `hint`
    (where the user gave the URI: the spec's tracking.uri, or a command's option); a server that
    does not answer is that sentence within seconds (`check_server_reachable`)."""
    check_server_reachable(uri, hint)
    with store_errors(uri, hint):
        return Tracker(uri, artifact_location, name)


@contextmanager
def store_errors(uri: str, hint: str = "check tracking.uri") -> Iterator[None]:
    """A store that cannot be opened or written becomes one sentence (ExecutorError)."""
    import sqlite3

    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except (MlflowException, SQLAlchemyError, sqlite3.Error, OSError) as err:  # sqlite3: a file that is no database
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        newer = newer_schema(first)
        if newer:
            import mlflow

            raise ExecutorError(
                f"the MLflow tracking store at {uri} was written by a newer MLflow than the installed {mlflow.__version__} "
                f"(its schema is at revision {newer}, which this MLflow does not know); upgrade MLflow "
                "(`pip install -U mlflow`) to read it, or give another tracking store; do not run `mlflow db upgrade` on it"
            ) from None
        raise ExecutorError(f"could not open the MLflow tracking store at {uri} ({first}); {hint}") from None


def newer_schema(message: str) -> str | None:
    """The schema revision MLflow's "out-of-date database schema (found version X, ...)" names when
    the installed MLflow has no migration of that revision (a store a newer MLflow wrote); else None."""
    found = re.search(r"out-of-date database schema \(found version (\w+)", message)
    if found is None:
        return None
    from mlflow.store import db_migrations

    versions = Path(db_migrations.__file__).parent / "versions"
    known = {path.name.split("_", 1)[0] for path in versions.glob("*.py")}
    return found[1] if known and found[1] not in known else None
