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


class TrainRun:
    """One `train`'s MLflow run, logged through the experiment's `Tracker` (its batching, number
    filter and already-logged pairs): `log_event` is a trainer callback; `finish` or `end` closes it."""

    def __init__(self, tracker: Any, run_id: str) -> None:
        self.tracker, self.run_id = tracker, run_id

    def log_event(self, kind: str, step: int, data: dict[str, Any]) -> None:
        self.tracker.log_event(self.run_id, kind, step, data)

    def finish(self, result: Any) -> None:
        """Log what the live events did not (the compute totals, and all of a resumed run's
        earlier steps) and mark the run FINISHED."""
        points = result_points(ledger_result(result), self.tracker.source_of(self.run_id))
        self.tracker.log_metrics(self.run_id, list(points))
        self.tracker.client.set_terminated(self.run_id, status="FINISHED")

    def end(self, status: str) -> None:
        """Mark the run FAILED or KILLED (training raised, or was interrupted)."""
        self.tracker.end_child(self.run_id, status)


def open_train_run(uri: str, experiment: str, config: TrainerConfig, out: Path, *, fresh: bool) -> TrainRun:
    """The MLflow run of training `config` into `out`, RUNNING, in the experiment `experiment` of
    the store at `uri`: the last one of the same folder and config continued, or (none, or `fresh`)
    a new one with its params. A store that cannot be opened is a UserError naming --tracking."""
    with user_errors(ExecutorError):
        tracker = open_tracker(uri, default_artifact_location(uri, out), experiment, hint="check --tracking")
    folder, digest = str(out.resolve()), config.digest()
    source = names.eval_source(config.to_dict())
    existing = None if fresh else _last_run(tracker, folder, digest)
    if existing is not None:
        tracker.client.update_run(existing.info.run_id, status="RUNNING")
        tracker.follow(existing.info.run_id, source)  # its logged pairs are read back on the first log
        return TrainRun(tracker, existing.info.run_id)
    tags = {**tracker.source_tags, ROLE_TAG: "train", OUT_TAG: folder, CONFIG_DIGEST_TAG: digest}
    run_id = tracker.client.create_run(tracker.experiment_id, run_name=out.resolve().name, tags=tags).info.run_id
    tracker.follow(run_id, source, new=True)
    tracker.log_params(run_id, flatten(config.to_dict()))
    tracker.client.log_dict(run_id, config.to_dict(), "config.json")
    return TrainRun(tracker, run_id)


def _last_run(tracker: Any, folder: str, digest: str) -> Any | None:
    """The latest run of this folder and config in the tracker's experiment, or None."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id], f"tags.`{CONFIG_DIGEST_TAG}` = '{digest}'",
        order_by=["attributes.start_time DESC"], max_results=100,
    )
    return next((run for run in runs if run.data.tags.get(OUT_TAG) == folder), None)
