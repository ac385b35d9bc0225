"""Reading an experiment back from its spec: the tidy results table, learning curves, and the
runs table of ``dapo-ablate status``.

Readers never create a store: a spec whose SQLite ledger does not exist yet (or is an empty
file) has no results (`ResultsError`) and every planned run is *new* in `status_rows`. Only the
runs of the spec's current plan are read, so runs the experiment needed with fewer seeds are left
out; a spec whose name the ledger binds to another design (`store.binding`) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.store.adaptive_state import current_plan
from dapo_ablate.ablation.store.binding import check_binding
from dapo_ablate.ablation.store.ledger import Ledger, LedgerError, RUN_STATUSES, connect_ledger
from dapo_ablate.ablation.store.tracking import normalize_tracking_uri, sqlite_path
from dapo_ablate.core.contracts import COMPUTE_COLUMNS, METRIC_PREFIXES

if TYPE_CHECKING:
    import pandas as pd

    from dapo_ablate.ablation.experiment.design import Calibration, Plan
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

NEW = "new"
"""Status shown for a planned run the ledger has not recorded yet."""


class ResultsError(ValueError):
    """An experiment has no results to read yet (or its ledger is unreachable); one sentence."""


def open_ledger(spec: ExperimentSpec) -> Ledger | None:
    """The spec's ledger, or None when it is a SQLite file that does not exist (yet) or is empty
    (a reader creates no tables). LedgerError for a database that is not a ledger."""
    path = sqlite_path(spec.ledger)
    if path is not None and (not path.exists() or (path.is_file() and path.stat().st_size == 0)):
        return None
    return connect_ledger(spec.ledger)


def load_experiment_results(
    spec_path: str | Path | ExperimentSpec,
) -> tuple[pd.DataFrame, list[str], pd.DataFrame | None, str, ParentRunLogger | None]:
    """``(results, factors, curves, design, mlflow_logger)`` of the experiment `spec_path` names
    (or of the spec itself, e.g. one with command-line overrides applied).

    results: one row per finished run: (a transfer study: ``setting`` first) one 0/1 column per factor (named after it), ``seed``, the
        metric columns (``avg@k``, ``pass@k``, ``maj@k``, then the rest of the final metrics),
        ``tokens_generated``, ``tokens_discarded``, ``wall_s`` and ``run_id``;
    curves: one row per (run, evaluation step): factor columns, ``seed``, ``step``, the
        evaluation metrics, ``tokens_generated`` (cumulative training tokens generated up to that
        step, discarded ones included; empty when the run recorded no step signals) and
        ``run_id`` (None when no run has a curve);
    design: the spec's design name; mlflow_logger: logs files to the experiment's MLflow
        parent run (None if the experiment was never run with MLflow).
    Raises SpecError for a bad spec and ResultsError when nothing has finished yet.
    """
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec, load_spec

    spec = spec_path if isinstance(spec_path, ExperimentSpec) else load_spec(spec_path)
    try:
        plan = spec_plan(spec)
    except LedgerError as err:
        raise ResultsError(str(err)) from None
    return experiment_tables(spec, plan, *_finished_runs(spec, plan))


def spec_plan(spec: ExperimentSpec) -> Plan:
    """The spec's plan as it stands: `expand(spec)`, or for design: adaptive stage 1 and the runs
    its recorded looks added (read from the ledger, which a reader does not create).
    LedgerError for a database that is not a ledger."""
    if spec.design != "adaptive":
        return current_plan(spec, None)
    ledger = open_ledger(spec)
    if ledger is None:
        return current_plan(spec, None)
    with ledger:
        return current_plan(spec, ledger)


def experiment_tables(
    spec: ExperimentSpec, plan: Plan, records: list[dict[str, Any]], parent_id: str | None
) -> tuple[pd.DataFrame, list[str], pd.DataFrame | None, str, ParentRunLogger | None]:
    """`load_experiment_results`' tables from the plan's finished runs' ledger records (those a
    driver already holds, e.g. `ExperimentSummary.records`) and the MLflow parent run's id."""
    factors = [factor.name for factor in plan.factors]
    logger = ParentRunLogger(spec.tracking.uri, parent_id) if parent_id else None
    order = {run.run_id: i for i, run in enumerate(plan.runs)}  # plan order, whoever read the records: one answer
    records = sorted(records, key=lambda record: order.get(record["run_id"], len(order)))
    results, curves = results_frame(records, factors), curves_frame(records, factors)
    if plan.settings:  # a transfer study: the `setting` column, first
        setting_of = {run.run_id: run.setting for run in plan.runs}
        for frame in (results, curves):
            if frame is not None:
                frame.insert(0, "setting", frame["run_id"].map(setting_of))
    return results, factors, curves, plan.design, logger


def results_frame(records: list[dict[str, Any]], factors: list[str]) -> pd.DataFrame:
    """The tidy results table (see `load_experiment_results`) of ledger result records."""
    import pandas as pd

    rows = []
    for record in records:
        metrics = record["metrics"] or {}
        rows.append({**_levels(record, factors), "seed": record["seed"], **metrics,
                     **{name: record[name] for name in COMPUTE_COLUMNS}, "run_id": record["run_id"]})
    frame = pd.DataFrame(rows)
    metric_columns = [c for c in frame.columns if c not in (*factors, "seed", *COMPUTE_COLUMNS, "run_id")]
    headline = sorted((c for c in metric_columns if c.startswith(METRIC_PREFIXES)), key=_headline_order)
    others = [c for c in metric_columns if c not in headline]
    return frame[[*factors, "seed", *headline, *others, *COMPUTE_COLUMNS, "run_id"]]


def curves_frame(records: list[dict[str, Any]], factors: list[str]) -> pd.DataFrame | None:
    """One row per (run, evaluation step); None when no run has an evaluation curve."""
    import pandas as pd

    rows = []
    for record in records:
        tokens = _tokens_by_step(record.get("signals"))
        rows += [
            {**_levels(record, factors), "seed": record["seed"], **point,
             "tokens_generated": tokens.get(point.get("step")), "run_id": record["run_id"]}
            for point in record["eval_curve"] or []
        ]
    if not rows:
        return None
    frame = pd.DataFrame(rows)
    rest = [c for c in frame.columns if c not in (*factors, "seed", "step", "run_id")]
    return frame[[*factors, "seed", "step", *rest, "run_id"]]


def _tokens_by_step(signals: list[dict[str, Any]] | None) -> dict[int, float]:
    """Cumulative generated tokens after each step (0 before the first), from per-step signals."""
    if not signals:
        return {}
    total, out = 0.0, {0: 0.0}
    for row in sorted(signals, key=lambda r: r.get("step", 0)):
        total += float(row.get("tokens_generated", 0.0) or 0.0)
        out[int(row.get("step", 0))] = total
    return out


def status_rows(spec: ExperimentSpec, plan: Plan) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The runs table of ``dapo-ablate status``: one dict per planned run, in plan order, with
    label (a transfer study's prefixed with the setting: ``tight OF+CH``), setting ("" without
    settings), seed, status (``new`` if the ledger has not recorded it), attempts, metric (the
    spec's, once done), wall_s, error, host, run_id and job_id (a verl cell's Ray job); and the number
    of runs per status."""
    ledger = open_ledger(spec)
    known: dict[str, dict[str, Any]] = {}
    if ledger is not None:
        with ledger:
            record = ledger.get_experiment(spec.name)
            check_binding(record, spec, ledger.url)
            if record is not None:
                known = {row["run_id"]: row for row in ledger.runs_table(spec.name)}
    rows = []
    for run in plan.runs:
        row = known.get(run.run_id, {})
        metrics = row.get("metrics") or {}
        rows.append({
            "label": f"{run.setting} {plan.label(run.cell)}" if run.setting else plan.label(run.cell),
            "setting": run.setting, "seed": run.seed, "status": row.get("status", NEW),
            "attempts": row.get("attempts", 0), "metric": metrics.get(spec.metric), "wall_s": row.get("wall_s"),
            "error": row.get("error"), "host": row.get("host"), "run_id": run.run_id, "job_id": row.get("job_id"),
        })
    counts = {status: 0 for status in (NEW, *RUN_STATUSES)}
    for row in rows:
        counts[row["status"]] += 1
    return rows, counts


def run_time_calibration(spec: ExperimentSpec, plan: Plan) -> Calibration | None:
    """The plan's finished runs' measured wall times as a `Calibration` of the time estimate;
    None while none has finished or the ledger cannot be read (`status` says why)."""
    from dapo_ablate.ablation.experiment.design import calibrate

    try:
        rows, _ = status_rows(spec, plan)
    except LedgerError:
        return None
    configs = {run.run_id: run.config for run in plan.runs}
    return calibrate((configs[row["run_id"]], row["wall_s"]) for row in rows if row["status"] == "done")


@dataclass(frozen=True)
class ParentRunLogger:
    """Logs files to an experiment's MLflow parent run (``report`` attaches its files here)."""

    tracking_uri: str
    parent_run_id: str

    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        from mlflow import MlflowClient

        from dapo_ablate.ablation.store.tracking import quiet_mlflow, rebase_artifacts

        quiet_mlflow()
        rebase_artifacts(normalize_tracking_uri(self.tracking_uri))  # a copied store writes into the copy
        MlflowClient(tracking_uri=normalize_tracking_uri(self.tracking_uri)).log_artifacts(
            self.parent_run_id, local_dir, artifact_path
        )


def _finished_runs(spec: ExperimentSpec, plan: Plan) -> tuple[list[dict[str, Any]], str | None]:
    """The plan's done runs as ledger result records, and the MLflow parent run id."""
    hint = f"run `dapo-ablate run` on the spec of {spec.name!r} first"
    try:
        ledger = open_ledger(spec)
        if ledger is None:
            raise ResultsError(f"experiment {spec.name!r} has no ledger at {spec.ledger} yet; {hint}")
        with ledger:
            record = ledger.get_experiment(spec.name)
            if record is None:
                raise ResultsError(f"the ledger at {ledger.url} has no experiment {spec.name!r}; {hint}")
            check_binding(record, spec, ledger.url)
            records = planned_records(plan, ledger.results(spec.name), ledger.url)
    except LedgerError as err:
        raise ResultsError(str(err)) from None
    if not records:
        raise ResultsError(f"experiment {spec.name!r} has no finished runs yet; {hint}")
    return records, record.mlflow_parent_run_id


def planned_records(plan: Any, records: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The ledger's result records of the plan's runs, each checked against the run its id names:
    a row whose cell or factor levels are not the ones the run id was made from (an edited row)
    is refused naming it (ResultsError), never reported under another cell's labels."""
    planned = {run.run_id: run.to_run_spec() for run in plan.runs}
    kept = [record for record in records if record["run_id"] in planned]
    for record in kept:
        run = planned[record["run_id"]]
        stored = record.get("factors") if isinstance(record.get("factors"), dict) else {}
        levels = {name: stored.get(name) for name in run.factors}
        if record.get("cell_key") != run.cell_key or any(
                not isinstance(level, (bool, int)) or int(level) != run.factors[name] for name, level in levels.items()):
            raise ResultsError(
                f"the ledger at {where} records run {record['run_id']} as cell {record.get('cell_key')!r} with levels "
                f"{levels}, but that run id is cell {run.cell_key!r} ({run.factors}): the row was edited; restore it, "
                f"or delete the run's row so that `dapo-ablate run` trains it again")
    return kept


def _levels(record: dict[str, Any], factors: list[str]) -> dict[str, int]:
    return {name: int(record["factors"][name]) for name in factors}


def _headline_order(column: str) -> tuple[int, str]:
    return next(i for i, prefix in enumerate(METRIC_PREFIXES) if column.startswith(prefix)), column
