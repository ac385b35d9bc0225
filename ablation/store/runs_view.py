"""The MLflow UI of an experiment as `dapo-ablate ui` opens it: the command that serves a store,
the runs table's saved view, and the link to it.

MLflow 3.17's UI takes the kind of the page it shows from its ``workflowType`` (URL parameter,
else the browser's last choice, else GenAI), so the link carries ``workflowType=machine_learning``
(the experiment's ``mlflow.experimentKind`` tag, `store.tracking`, is not enough there).

The runs table's view (`RunsView`) is saved as an MLflow shared view: the experiment tag
``mlflow.sharedViewState.<key>`` holds what the UI's "Share" writes (an envelope with the view's
name and its state as JSON: search facets and table state), and ``viewStateShareKey=<key>`` in
the page's URL applies it. The URL itself carries only the search facets; the columns shown
(``selectedColumns``, ``columnOrder``) are table state, so they travel in the shared view.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from dapo_ablate.ablation.store.tracking import (
    EXPERIMENT_KIND_TAG,
    TRAINING_KIND,
    normalize_tracking_uri,
    quiet_mlflow,
    store_errors,
)

WORKFLOW_TYPE = "machine_learning"
"""The UI's ``workflowType`` URL parameter of training experiments (the other one is ``genai``)."""
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
"""MLflow's experiment-tag prefix of a shared runs-table view; the rest is its ``viewStateShareKey``."""
RUNS_VIEW_KEY = "dapo-ablate"
"""The share key of the view `dapo-ablate ui` saves (one per experiment, rewritten on each start)."""


def mlflow_ui_command(uri: str, port: int) -> list[str]:
    """The command serving the MLflow UI of the store at `uri` on 127.0.0.1:`port`."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", normalize_tracking_uri(uri),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]



def metric_column(name: str) -> str:
    """The runs table's column of MLflow metric `name` (the UI's canonical key)."""
    return f"metrics.`{name}`"


def param_column(name: str) -> str:
    """The runs table's column of MLflow param `name`."""
    return f"params.`{name}`"


def tag_column(name: str) -> str:
    """The runs table's column of MLflow tag `name`."""
    return f"tags.`{name}`"


def pp_tag(metric: str) -> str:
    """The tag that shows fraction metric `metric` of a run in percentage points, one decimal
    ("49.7"), as every page of the project shows accuracy; the metric itself stays a fraction.
    (MLflow's names allow no brackets.)"""
    return f"{metric} in pp"


@dataclass(frozen=True)
class RunsView:
    """A view of an experiment's runs table: which columns, in which order, ranked by what."""

    name: str
    """Its name in the UI's views menu."""
    rank_by: str
    """The MLflow metric the rows are ordered by, highest first. Ordered by anything but start
    time, MLflow lists child runs as rows of their own instead of nesting them under a collapsed
    parent, which is what shows them all: a shared view cannot carry expanded rows (the UI drops
    ``runsExpanded`` from it). Runs without the metric (the parent) come last."""
    columns: tuple[str, ...]
    """Column keys (`metric_column`, `param_column`), shown in this order."""
    widths: dict[str, int] = field(default_factory=dict)
    """Column key -> width in pixels, where the UI's default would cut its name short."""
    percent: tuple[str, ...] = ()
    """Fraction metrics whose runs get their `pp_tag` (set when the view is saved) as a column."""

    def state(self) -> dict[str, Any]:
        """The view as the UI's shared state: search facets (those the URL carries) and table state."""
        columns = list(self.columns)
        return {"searchFilter": "", "orderByKey": metric_column(self.rank_by), "orderByAsc": False,
                "selectedColumns": columns, "columnOrder": columns, "columnWidths": dict(self.widths)}


def save_runs_view(uri: str, experiment_name: str, view: RunsView) -> str | None:
    """Save `view` as the shared view `RUNS_VIEW_KEY` of experiment `experiment_name` (its first
    save time kept) and tag the experiment a training one where it is not. The experiment's id,
    or None when the store holds no active experiment of that name (then nothing is written)."""
    quiet_mlflow()
    from mlflow import MlflowClient

    key = SHARED_VIEW_PREFIX + RUNS_VIEW_KEY
    with store_errors(uri):
        client = MlflowClient(tracking_uri=normalize_tracking_uri(uri))
        experiment = client.get_experiment_by_name(experiment_name)
        if experiment is None or experiment.lifecycle_stage != "active":
            return None
        now = int(time.time() * 1000)
        envelope = {"name": view.name, "createdAt": _view_created(experiment.tags.get(key)) or now,
                    "updatedAt": now, "state": json.dumps(view.state())}
        client.set_experiment_tag(experiment.experiment_id, key, json.dumps(envelope))
        if experiment.tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
        _tag_in_pp(client, experiment.experiment_id, view.percent)
    return experiment.experiment_id


def _tag_in_pp(client: Any, experiment_id: str, metrics: tuple[str, ...]) -> None:
    """Give every run of the experiment that has one of `metrics` its `pp_tag` (where missing or
    stale), so the runs table reads 49.7, not 0.49658203125."""
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        for run in page:
            for metric in metrics:
                value = run.data.metrics.get(metric)
                shown = None if value is None else f"{100 * value:.1f}"
                if shown is not None and run.data.tags.get(pp_tag(metric)) != shown:
                    client.set_tag(run.info.run_id, pp_tag(metric), shown)
        token = page.token
        if not token:
            return


def _view_created(envelope: str | None) -> int | None:
    """When a saved view was first saved (its envelope's ``createdAt``), if it is one."""
    try:
        created = json.loads(envelope or "null")["createdAt"]
    except (ValueError, TypeError, KeyError):
        return None
    return created if isinstance(created, int) else None


def runs_page_link(base_url: str, experiment_id: str | None) -> str:
    """The UI's page of the experiment's runs table in the "Model training" workflow with the view
    `RUNS_VIEW_KEY` applied; without an experiment, the experiments list."""
    from urllib.parse import urlencode

    if experiment_id is None:
        return f"{base_url}/#/experiments?" + urlencode({"workflowType": WORKFLOW_TYPE})
    query = urlencode({"workflowType": WORKFLOW_TYPE, "viewStateShareKey": RUNS_VIEW_KEY})
    return f"{base_url}/#/experiments/{experiment_id}/runs?{query}"
