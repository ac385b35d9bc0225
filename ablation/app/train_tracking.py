"""`dapo-ablate train --tracking URI`: the run as one MLflow run, under the names `run` uses.

The store is opened through `store.tracking.open_tracker` (the experiment is created with MLflow's
training kind, a copied SQLite store's artifacts rebased, an unreachable store one sentence); the
run carries the resolved config as params (dotted, as `run`'s child runs) and as ``config.json``,
each training step's signals and each evaluation as they happen (`metric_names.step_metrics` /
`eval_metrics`: ``critic/score/mean``, ``actor/pg_clipfrac``, ``val-core/<source>/acc/mean_at_32``,
...), and at the end the compute totals (``perf/...``) of `store.tracking.result_points`.

A rerun that resumes from a checkpoint in the same --out with the same config continues its
MLflow run (found by the tags ``dapo.train_out`` and ``dapo.config_digest``; a (metric, step)
already there is not logged again); a run trained from its first step (no checkpoint, `--force`,
`--no-resume`) is a new MLflow run.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from dapo_ablate.ablation.app.errors import user_errors
from dapo_ablate.ablation.runtime.cell import ledger_result
from dapo_ablate.ablation.store import metric_names as names
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.tracking import (
    ROLE_TAG,
    default_artifact_location,
    flatten,
    open_tracker,
    result_points,
)
from dapo_ablate.core.config import TrainerConfig

OUT_TAG = "dapo.train_out"
"""The absolute --out folder the run trains into."""
CONFIG_DIGEST_TAG = "dapo.config_digest"
"""The resolved config's digest (`TrainerConfig.digest`)."""
_PARAMS_PER_CALL = 100  # MLflow's log_batch limits
_METRICS_PER_CALL = 1000


class TrainRun:
    """One `train`'s MLflow run: `log_event` is a trainer callback; `finish` or `end` closes it."""

    def __init__(self, client: Any, run_id: str, source: str, logged: set[tuple[str, int]]) -> None:
        self.client, self.run_id, self.source = client, run_id, source
        self.logged = logged
        """(metric, step) pairs already in the store."""

    def log_event(self, kind: str, step: int, data: dict[str, Any]) -> None:
        renamed = names.step_metrics(data) if kind == "step" else names.eval_metrics(data, self.source)
        self._log([(key, value, int(step)) for key, value in renamed.items()])

    def finish(self, result: Any) -> None:
        """Log what the live events did not (the compute totals, and all of a resumed run's
        earlier steps) and mark the run FINISHED."""
        self._log(list(result_points(ledger_result(result), self.source)))
        self.client.set_terminated(self.run_id, status="FINISHED")

    def end(self, status: str) -> None:
        """Mark the run FAILED or KILLED (training raised, or was interrupted)."""
        self.client.set_terminated(self.run_id, status=status)

    def _log(self, points: list[tuple[str, Any, int]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value, step in points:
            if _loggable(value) and (key, step) not in self.logged:
                self.logged.add((key, step))
                batch.append(Metric(key, float(value), now, step))
        for start in range(0, len(batch), _METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=batch[start:start + _METRICS_PER_CALL])


def open_train_run(uri: str, experiment: str, config: TrainerConfig, out: Path, *, fresh: bool) -> TrainRun:
    """The MLflow run of training `config` into `out`, RUNNING, in the experiment `experiment` of
    the store at `uri`: the last one of the same folder and config continued, or (none, or `fresh`)
    a new one with its params. A store that cannot be opened is a UserError naming --tracking."""
    with user_errors(ExecutorError):
        try:
            tracker = open_tracker(uri, default_artifact_location(uri, out), experiment)
        except ExecutorError as err:
            raise ExecutorError(str(err).replace("check tracking.uri", "check --tracking")) from None
    client, folder, digest = tracker.client, str(out.resolve()), config.digest()
    source = names.eval_source(config.to_dict())
    existing = None if fresh else _last_run(tracker, folder, digest)
    if existing is not None:
        client.update_run(existing.info.run_id, status="RUNNING")
        return TrainRun(client, existing.info.run_id, source, _pairs_in_store(client, existing))
    tags = {**tracker.source_tags, ROLE_TAG: "train", OUT_TAG: folder, CONFIG_DIGEST_TAG: digest}
    run = client.create_run(tracker.experiment_id, run_name=out.resolve().name, tags=tags)
    run_id = run.info.run_id
    _log_config_params(client, run_id, flatten(config.to_dict()))
    client.log_dict(run_id, config.to_dict(), "config.json")
    return TrainRun(client, run_id, source, set())


def _last_run(tracker: Any, folder: str, digest: str) -> Any | None:
    """The latest run of this folder and config in the tracker's experiment, or None."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id], f"tags.`{CONFIG_DIGEST_TAG}` = '{digest}'",
        order_by=["attributes.start_time DESC"], max_results=100,
    )
    return next((run for run in runs if run.data.tags.get(OUT_TAG) == folder), None)


def _pairs_in_store(client: Any, run: Any) -> set[tuple[str, int]]:
    run_id = run.info.run_id
    return {(key, point.step) for key in run.data.metrics for point in client.get_metric_history(run_id, key)}


def _log_config_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    listed = [Param(key, json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value))
              for key, value in params.items()]
    for start in range(0, len(listed), _PARAMS_PER_CALL):
        client.log_batch(run_id, params=listed[start:start + _PARAMS_PER_CALL])


def _loggable(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not (isinstance(value, float) and math.isinf(value))
