"""An experiment's MLflow as a `RunListener` of the one `Driver`: the parent run (opened, checked
against the experiment's digest, ended), one child run per run (started RUNNING before its task
starts, its steps and evaluations logged live, its result logged when it is recorded, ended
FAILED or KILLED otherwise), the finished runs a stopped driver had not logged, and an adaptive
design's looks. Every write is retried through the store's blips (`store.transient.Retrying`)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Callable

from dapo_ablate.ablation.runtime.backends.registry import backend_of
from dapo_ablate.ablation.runtime.driver import DONE_ELSEWHERE, FAILED_ATTEMPT, LEASE_LOST, RECORDED, RunListener, Settled
from dapo_ablate.ablation.runtime.pool import MLFLOW_RUN_ENV
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import DONE, Ledger
from dapo_ablate.ablation.store.tracking import (
    ChildRun,
    default_artifact_location,
    flatten,
    markdown_code,
    markdown_text,
    open_tracker,
)
from dapo_ablate.ablation.store.transient import MLFLOW, Retrying

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan, PlannedRun
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec


class MlflowRuns(RunListener):
    """One invocation's MLflow: the parent of `spec`'s experiment and the child runs of `planned`
    (run id -> planned run; the scheduler's own mapping, grown with the plan). `say` shows a line
    to the user (the display's)."""

    def __init__(self, spec: ExperimentSpec, plan: Plan, planned: dict[str, PlannedRun], ledger: Ledger) -> None:
        self.spec, self.plan, self.planned, self.ledger, self.name = spec, plan, planned, ledger, spec.name
        self.say: Callable[[str], None] = lambda line: None
        """Shows a line of its own (not `note`: that is the listener's method, told every note)."""
        self.live: dict[str, str] = {}
        """Ledger run id -> MLflow id of the child runs of the runs in flight."""
        self.live_off: set[str] = set()
        """Runs whose live MLflow logging stopped (the store stayed down)."""
        self.parent_id: str | None = None

    # -- the parent -----------------------------------------------------------------------------

    def open(self, digest: str) -> None:
        """MLflow's store, created here once, before any task starts (docs/stores.md: processes
        creating a fresh SQLite store at once race on its schema); a parent run of another design
        under this name is refused (`Tracker.check_parent`)."""
        tracking = self.spec.tracking
        location = tracking.artifact_location or default_artifact_location(tracking.uri, self.spec.output_dir)
        self.tracker = open_tracker(tracking.uri, location, self.name)
        self.stored = Retrying(self.tracker, MLFLOW)
        record = self.ledger.get_experiment(self.name)
        self.tracker.check_parent(record.mlflow_parent_run_id if record else None, digest)

    def open_parent(self, digest: str) -> None:
        """The experiment's parent run (this name's, or a new one) with its tags, params and spec;
        its id in the ledger."""
        plan, spec = self.plan, self.spec
        record = self.ledger.get_experiment(self.name)
        tags = {"dapo.design": plan.design, "dapo.factors": ",".join(f.name for f in plan.factors),
                "dapo.seeds": ",".join(map(str, plan.seeds)), "dapo.runs": str(len(plan.runs))}
        if plan.settings:
            tags["dapo.settings"] = ",".join(plan.settings)
        tags["mlflow.note.content"] = parent_note(spec, plan)
        params = {"design": plan.design, "factors": ",".join(f.name for f in plan.factors),
                  "seeds": ",".join(map(str, plan.seeds)), "metric": spec.metric,
                  **{f"base.{k}": v for k, v in flatten(spec.trainer.to_dict()).items()}}
        self.parent_id = self.tracker.parent_run(record.mlflow_parent_run_id if record else None, name=self.name,
                                                 tags=tags, params=params, digest=digest)
        self.ledger.set_mlflow_parent(self.name, self.parent_id)
        self.tracker.log_dict(self.parent_id, spec.to_dict(), "spec.json")

    def log_unlogged(self, rows: dict[str, dict[str, Any]], records: dict[str, dict[str, Any]]) -> None:
        """The plan's finished runs without a finished MLflow child (a driver died between the two
        writes, or another experiment trained the shared run) are logged now."""
        logged = self.tracker.finished_children(self.parent_id)
        for run_id, record in records.items():
            if rows[run_id]["status"] == DONE and run_id not in logged:
                self._log_child(run_id, record, record["mlflow_run_id"] is None)

    def end(self, status: str, interrupted: bool) -> None:
        """The parent run ended with `status`. After an interruption a failure to end it is a line
        on stderr (e.g. a Ctrl-C cut an MLflow write and its SQLite lock lingers: the ledger
        holds the truth, the summary still comes); otherwise it is raised."""
        try:
            self.stored.end_parent(self.parent_id, status, doing="end the MLflow parent run")
        except Exception as err:  # noqa: BLE001
            if not interrupted:
                raise
            print(f"{self.name}: the MLflow parent run was left RUNNING ({str(err).splitlines()[0][:200]})", file=sys.stderr)

    # -- the runs' events (RunListener) ---------------------------------------------------------

    def starting(self, run_id: str) -> dict[str, str]:
        """The run's MLflow child, RUNNING, before its task starts; the task's environment names
        it (a verl job logs into it)."""
        self.live[run_id] = self.stored.start_child(self.parent_id, self._child_run(run_id, {}),
                                                    doing=f"start the MLflow run of {self.planned[run_id].name}")
        return {MLFLOW_RUN_ENV: self.live[run_id]}

    def event(self, run_id: str, kind: str, step: int, data: dict[str, Any]) -> None:
        """A run's training step or evaluation, logged to its MLflow child while it trains. Best
        effort: when the store stays down, live logging stops for that run with a note (the
        result is logged in full when the run finishes); the runs go on."""
        if run_id in self.live and kind in ("step", "eval") and run_id not in self.live_off:
            try:
                self.stored.log_event(self.live[run_id], kind, step, data,
                                      doing=f"log {self.planned[run_id].name}'s {kind} {step} to MLflow")
            except ExecutorError as err:
                self.live_off.add(run_id)
                self.say(f"{self.planned[run_id].name}: live MLflow logging stopped ({err})")

    def settled(self, settled: Settled | None, in_flight: int) -> None:
        if settled is None:
            return
        if settled.what == RECORDED:
            self._log_child(settled.run_id, settled.result or {}, set_ledger=True)
        elif settled.what == FAILED_ATTEMPT:
            self._end_child(settled.run_id, "FAILED")
        elif settled.what in (DONE_ELSEWHERE, LEASE_LOST):  # the other driver logs it (or continues its child)
            self.live.pop(settled.run_id, None)

    def grown(self, plan: Plan, added: int) -> None:
        self.plan = plan

    def looked(self, looks: list[dict[str, Any]]) -> None:
        self.stored.log_dict(self.parent_id, {"looks": looks}, "looks.json", doing="log the looks to the MLflow parent run")

    def abandoned(self, released: list[str]) -> None:
        """Ctrl-C, SIGTERM or a driver error: the children of the runs given back show KILLED (the
        next invocation continues them). No retries: the store may be what failed."""
        for run_id in released:
            mlflow_id = self.live.pop(run_id, None)
            try:
                if mlflow_id is not None:
                    self.tracker.end_child(mlflow_id, "KILLED")
            except Exception:  # noqa: BLE001 - the ledger is what counts
                pass

    # -- the children ---------------------------------------------------------------------------

    def _log_child(self, run_id: str, result: dict[str, Any], set_ledger: bool) -> None:
        live_id = self.live.pop(run_id, None)
        child = self._child_run(run_id, result)
        if backend_of(self.planned[run_id].config).job_from_driver and live_id is not None:
            # the job (verl's) logged its metrics into this very run: it is finished, not logged a second time
            self.stored.end_child(live_id, "FINISHED", doing=f"finish the MLflow run of {child.name}")
            mlflow_id = live_id
        else:
            mlflow_id = self.stored.log_child(self.parent_id, child, doing=f"log {child.name} to MLflow")
        if set_ledger:
            Retrying(self.ledger).set_mlflow_run(run_id, mlflow_id, doing=f"record the MLflow run of {child.name}")

    def _end_child(self, run_id: str, status: str) -> None:
        """A run in flight stopped without a result: its child run shows FAILED or KILLED."""
        mlflow_id = self.live.pop(run_id, None)
        if mlflow_id is not None:
            self.stored.end_child(mlflow_id, status, doing=f"end the MLflow run of {self.planned[run_id].name}")

    def _child_run(self, run_id: str, result: dict[str, Any]) -> ChildRun:
        planned = self.planned[run_id]
        tags = {
            "dapo.design": self.plan.design,
            "dapo.cell": planned.cell.key,
            "dapo.cell_label": self.plan.label(planned.cell),
            "dapo.orderings": ",".join(self.plan.orderings_through(planned.cell)),
            "dapo.experiment": self.name,
        } | ({"dapo.setting": planned.setting} if planned.setting else {})
        return ChildRun(run_id, planned.name, dict(planned.factors), planned.seed, planned.config.to_dict(), result, tags)


def parent_note(spec: ExperimentSpec, plan: Plan) -> str:
    """The MLflow parent's description: design, factors, seeds, runs, metric (and settings). MLflow
    renders it as Markdown: every name in it is escaped (`markdown_code`, `markdown_text`)."""
    lines = [
        f"Ablation {markdown_code(spec.name)}: {plan.design} design over {len(plan.factors)} factors "
        f"({', '.join(markdown_text(f.name) for f in plan.factors)}), {len(plan.cells)} cells x seeds "
        f"{', '.join(map(str, plan.seeds))} = {len(plan.runs)} runs; metric {markdown_text(spec.metric)}.",
    ]
    lines += [f"- {markdown_text(line)}" for line in plan.supports]
    if plan.settings:
        lines += ["", settings_note(spec)]
    return "\n".join(lines)


def settings_note(spec: ExperimentSpec) -> str:
    """The MLflow parent's description of a transfer study: one line per setting and its overrides."""
    lines = [f"Transfer study over {len(spec.settings)} settings (the design runs in each):"]
    lines += [f"- {markdown_text(s.name)}: {markdown_code(json.dumps(s.overrides, sort_keys=True))}" for s in spec.settings]
    return "\n".join(lines)
