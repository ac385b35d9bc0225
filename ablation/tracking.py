"""MLflow logging of an experiment: one MLflow experiment per spec, one parent run, one child
run per finished cell x seed.

Only the driver writes MLflow (Ray tasks never touch it). Creating a `Tracker` opens the store
once, before any task starts: several processes creating a fresh SQLite store at once race on
its schema (FINDINGS).

Idempotence, so that a rerun never duplicates anything:
  - the parent run is found again by the id the ledger recorded, else by its ``dapo.role`` tag;
  - a child run carries the ledger's run id as tag ``dapo.run_id`` from the moment it is created
    and is marked FINISHED only after everything was logged. A FINISHED child is reused as it is;
    an unfinished one (the driver died while logging it) is deleted and logged again.

Names: MLflow metric names may not contain ``@``, so ``avg@32`` is logged as ``avg_at_32``
(also ``eval/avg_at_32`` per evaluation step). Training signals are ``train/<signal>`` per
rollout step (documented in `dapo_ablate.core.trainer.SIGNALS`).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_ablate.ablation.database import with_psycopg_driver

ROLE_TAG = "dapo.role"
RUN_ID_TAG = "dapo.run_id"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag
_PAGE = 1000
_ENTITIES_PER_BATCH = 1000  # MLflow's log_batch limits
_PARAMS_PER_BATCH = 100
_TAG_CHARS = 5000  # MLflow refuses tag values over 8000 characters (long ordering lists)


@dataclass(frozen=True)
class ChildRun:
    """Everything a child run shows: one finished cell x seed."""

    run_id: str
    """The ledger's run id (content hash)."""
    name: str
    """Readable name, e.g. ``GRPO s0`` or ``OF+CH+SP+TL+DS s0``."""
    factors: dict[str, int]
    """Factor name -> level (0/1)."""
    seed: int
    config: dict[str, Any]
    """The fully resolved trainer config."""
    result: dict[str, Any]
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
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._ensure_experiment(experiment_name, artifact_location)

    # -- parent ---------------------------------------------------------------------------------

    def parent_run(self, known_id: str | None, *, name: str, tags: dict[str, str]) -> str:
        """The experiment's parent run id, reused if it exists, else created; marked RUNNING.

        `known_id`: the id recorded in the ledger (tried first). `tags` are (re)set every time.
        """
        parent = self._active_run(known_id) if known_id else None
        if parent is None:
            found = self._search(f"tags.`{ROLE_TAG}` = 'parent'")
            parent = found[0] if found else None
        if parent is None:
            parent = self.client.create_run(self.experiment_id, run_name=name, tags={ROLE_TAG: "parent"})
        parent_id = parent.info.run_id
        self.client.log_batch(parent_id, tags=_tags(tags))
        self.client.update_run(parent_id, status="RUNNING")
        return parent_id

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

    def log_child(self, parent_id: str, child: ChildRun) -> str:
        """Log `child` under the parent unless a FINISHED child with its run id exists; its id."""
        for run in self._search(f"tags.`{RUN_ID_TAG}` = '{child.run_id}'"):
            if run.data.tags.get(PARENT_TAG) != parent_id:
                continue
            if run.info.status == "FINISHED":
                return run.info.run_id
            self.client.delete_run(run.info.run_id)  # half-logged by a driver that died
        return self._create_child(parent_id, child)

    def _create_child(self, parent_id: str, child: ChildRun) -> str:
        from mlflow.entities import Param

        wall_ms = int(1000 * float(child.result.get("wall_s") or 0.0))
        end_ms = int(time.time() * 1000)
        tags = {PARENT_TAG: parent_id, RUN_ID_TAG: child.run_id, ROLE_TAG: "child", **child.tags}
        tags = {key: str(value)[:_TAG_CHARS] for key, value in tags.items()}
        run = self.client.create_run(
            self.experiment_id, start_time=end_ms - wall_ms, tags=tags, run_name=child.name
        )
        run_id = run.info.run_id
        params = {
            **{f"factor.{name}": level for name, level in child.factors.items()},
            **flatten(child.config),
            "seed": child.seed,
            "run_id": child.run_id,
            **({"setting": child.tags["dapo.setting"]} if "dapo.setting" in child.tags else {}),
        }
        param_list = [Param(key, _param_value(value)) for key, value in params.items()]
        for batch_params, batch_metrics in _batches(param_list, list(result_metrics(child.result, end_ms))):
            self.client.log_batch(run_id, metrics=batch_metrics, params=batch_params)
        self.client.log_dict(run_id, child.config, "config.json")
        self.client.set_terminated(run_id, status="FINISHED", end_time=end_ms)
        return run_id

    # -- internals ------------------------------------------------------------------------------

    def _ensure_experiment(self, name: str, artifact_location: str | None) -> str:
        experiment = self.client.get_experiment_by_name(name)  # first touch creates the store
        if experiment is None:
            return self.client.create_experiment(name, artifact_location=artifact_location)
        if experiment.lifecycle_stage == "deleted":
            self.client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id

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


def result_metrics(result: dict[str, Any], timestamp_ms: int) -> Iterator[Any]:
    """MLflow metrics of a ledger result: training signals and the eval curve per step, then
    the final metrics and compute totals at the last step. Non-numeric values are skipped."""
    from mlflow.entities import Metric

    last_step = 0
    for row in result.get("signals") or []:
        step = int(row.get("step", 0))
        last_step = max(last_step, step)
        for key, value in row.items():
            if key != "step" and _is_number(value):
                yield Metric(f"train/{metric_name(key)}", float(value), timestamp_ms, step)
    for row in result.get("eval_curve") or []:
        step = int(row.get("step", 0))
        last_step = max(last_step, step)
        for key, value in row.items():
            if key != "step" and _is_number(value):
                yield Metric(f"eval/{metric_name(key)}", float(value), timestamp_ms, step)
    totals = {key: result.get(key) for key in ("tokens_generated", "tokens_discarded", "wall_s")}
    for key, value in {**(result.get("metrics") or {}), **totals}.items():
        if _is_number(value):
            yield Metric(metric_name(key), float(value), timestamp_ms, last_step)


def metric_name(key: str) -> str:
    """An MLflow-legal metric name: ``avg@32`` -> ``avg_at_32``."""
    return key.replace("@", "_at_")


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


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for anything else)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):])


def default_artifact_location(uri: str, output_dir: str | Path) -> str | None:
    """Where a new experiment's artifacts go when the spec names no place.

    A SQLite store: ``mlartifacts/`` next to its database file; another database: ``mlartifacts/``
    in the output folder (MLflow's default would be ``./mlruns`` in whatever folder the driver
    was started from); an MLflow server: None, the server's own default.
    """
    path = sqlite_path(uri)
    if path is not None:
        return (path.resolve().parent / "mlartifacts").as_uri()
    if uri.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres", "mysql", "mssql"):
        return (Path(output_dir).resolve() / "mlartifacts").as_uri()
    return None


def quiet_mlflow() -> None:
    """Silence the store's migration chatter (INFO lines on every fresh database)."""
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.store.sqlalchemy", "mlflow.tracking"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _tags(tags: dict[str, str]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(key, str(value)[:_TAG_CHARS]) for key, value in tags.items()]


def _param_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)


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


def mlflow_ui_command(uri: str, port: int) -> list[str]:
    """The command serving the MLflow UI of the store at `uri` on 127.0.0.1:`port`."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", normalize_tracking_uri(uri),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
