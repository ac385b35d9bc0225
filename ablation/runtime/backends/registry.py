"""The trainers a cell runs on, one `Backend` each, found by ``TrainerConfig.backend`` (`backend_of`).

What differs between the built-in trainer and verl is answered here and nowhere else: how a run
executes (in the Ray task's own process, or as a Ray job the task submits and watches), what the
task declares to Ray, where a run keeps the checkpoints the driver may prune, which prompt length
the context check assumes, what the spec must satisfy (`check`: the same for the trainer and for a
test's stand-in cell function, which replaces only the execution), what the driver prepares
before any store is written (`prepare`) and checks on the cluster once MLflow's store exists
(`check_nodes`), what `validate` adds to the plan (`plan_text`, `estimate_note`), each run's time
limit (`time_limits`) and which failures are retried (`retries`). The
scheduler, ledger, MLflow layout and reports are the same for every backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dapo_ablate.ablation.runtime.backends.job_failures import REAL_FAILURE
from dapo_ablate.ablation.runtime.backends.verl_checkpoints import own_checkpoint_dir
from dapo_ablate.ablation.runtime.backends.verl_cluster import (
    check_cluster,
    check_placement,
    check_shared_tracking,
    concurrent_jobs_problem,
    node_needs,
)
from dapo_ablate.ablation.runtime.backends.verl_cluster import jobs_at_once as verl_jobs_at_once
from dapo_ablate.ablation.runtime.backends.verl_job import (
    JOB_ENV,
    REQUIREMENTS,
    verl_job,
    write_package_copy,
)
from dapo_ablate.ablation.runtime.backends.verl import VerlTranslationError
from dapo_ablate.ablation.runtime.backends.verl_plan import format_verl_jobs, time_limits, verl_jobs
from dapo_ablate.ablation.runtime.time_limit import TimeLimit
from dapo_ablate.core.config import TrainerConfig

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan, PlannedRun
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

__all__ = ["BACKENDS", "JOB_WATCHER", "Backend", "backend_named", "backend_of", "check_backends", "estimate_note",
           "jobs_at_once", "plan_texts", "runs_by_backend", "time_limits_of"]

JOB_WATCHER = {"num_cpus": 0, "num_gpus": 0}
"""Resources of a task that only submits a Ray job and waits for it: none (the job holds its own)."""


class Backend(Protocol):
    """One trainer a cell can run on. Methods taking `runs` get the plan's runs on this backend
    (never empty), in plan order."""

    name: str
    """The ``TrainerConfig.backend`` literal it answers to."""
    runs_as_job: bool
    """True: the run's task submits the cell as a Ray job and waits for it (`jobs.job_cell`);
    False: the task trains it in its own process (`cell.run_cell`)."""
    job_from_driver: bool
    """A Ray job built by the driver (handed over in ``$DAPO_ABLATE_VERL_JOB``) that logs into the
    run's MLflow child itself, where its result is read back; False: this package's trainer as the
    job's entrypoint, its result printed as the log's last line."""
    task_resources: dict[str, float] | None
    """What the run's Ray task declares (None: ``executor.cpus_per_run`` / ``gpus_per_run``)."""
    estimate_note: str | None
    """`validate`'s compute line in place of the CPU-scaled run time (None: that estimate applies)."""

    def jobs_at_once(self, runs: list[PlannedRun]) -> int | None:
        """Most of these runs one driver keeps in flight at once (None: no limit of their own)."""

    def prompt_tokens(self, max_prompt_length: int) -> int:
        """The prompt length the context check counts before the response ceiling, given the
        run's ``verl.max_prompt_length``."""

    def checkpoint_folder(self, config: TrainerConfig, run_folder: Path) -> Path | None:
        """The folder of a done run's checkpoints that ``executor.checkpoints_when_done`` prunes (None: none)."""

    def check(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> None:
        """Refuse, in one sentence, a spec this backend cannot run (reads only)."""

    def plan_text(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> str | None:
        """What `validate` prints after the plan for these runs (None: nothing)."""

    def prepare(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> dict[str, dict[str, str]]:
        """Before any store is written: run id -> what its task's environment adds; refuses a run
        the connected cluster cannot place."""

    def check_nodes(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> None:
        """Once the MLflow store exists: every node of the cluster can run these runs."""

    def time_limits(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> dict[str, TimeLimit]:
        """Run id -> its own time limit; a run left out runs under ``executor.run_timeout_s``."""

    def retries(self, error: str, timed_out: bool) -> bool:
        """Whether a failed attempt (the ledger's `error`; `timed_out`: past its time limit) is
        worth another, within ``executor.retries``."""


class BuiltinBackend:
    """This package's one-process trainer (`core.train`), in the run's Ray task."""

    name = "builtin"
    runs_as_job = False
    job_from_driver = False
    task_resources = None
    estimate_note = None

    def jobs_at_once(self, runs: list[PlannedRun]) -> int | None:
        return None

    def prompt_tokens(self, max_prompt_length: int) -> int:
        return 1  # prompts are not truncated to a ceiling here: any prompt is at least one token

    def checkpoint_folder(self, config: TrainerConfig, run_folder: Path) -> Path | None:
        return None  # the trainer's own checkpoint is what a retry resumes from: never pruned

    def check(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> None:
        return None

    def plan_text(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> str | None:
        return None

    def prepare(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> dict[str, dict[str, str]]:
        return {}

    def check_nodes(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> None:
        return None

    def time_limits(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> dict[str, TimeLimit]:
        return {}

    def retries(self, error: str, timed_out: bool) -> bool:
        return not timed_out  # any failure may be a blip; a run that hung would hang again


class VerlBackend:
    """A verl DAPO job per run on the Ray cluster (`backends.verl_job`), watched by a task that
    holds no resources; verl logs into the run's MLflow child."""

    name = "verl"
    runs_as_job = True
    job_from_driver = True
    task_resources = JOB_WATCHER
    estimate_note = "time and GPU-hours in the verl jobs' estimate below (calibrated once runs have finished)"

    def jobs_at_once(self, runs: list[PlannedRun]) -> int | None:
        """None (each job its own TransferQueue: verl_isolation), or 1 when a cell's TransferQueue
        backend or metrics port is shared by every job on a node (verl_cluster.jobs_at_once)."""
        return verl_jobs_at_once([run.config for run in runs])

    def prompt_tokens(self, max_prompt_length: int) -> int:
        return max_prompt_length  # verl sizes every sequence as the prompt ceiling plus the response ceiling

    def checkpoint_folder(self, config: TrainerConfig, run_folder: Path) -> Path | None:
        return own_checkpoint_dir(config, run_folder)

    def check(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> None:
        verl_jobs(spec, runs)  # raises VerlTranslationError (one sentence); a shared store is the driver's check
        problem = concurrent_jobs_problem(spec.executor.max_concurrent, [run.config for run in runs])
        if problem:
            raise VerlTranslationError(problem)

    def plan_text(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> str | None:
        return format_verl_jobs(spec, runs)

    def prepare(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> dict[str, dict[str, str]]:
        """Every run's job built as the dry run prints it (handed to its task in ``$JOB_ENV``), its
        shape checked against the cluster's nodes."""
        jobs = {run.run_id: verl_job(spec, run) for run in runs}
        job = next(iter(jobs.values()))
        check_shared_tracking(job.env["MLFLOW_TRACKING_URI"], job.nnodes)
        check_placement(job.nnodes, job.gpus_per_node)
        return {run_id: {JOB_ENV: job.to_json()} for run_id, job in jobs.items()}

    def check_nodes(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> None:
        """This package copied where the jobs ship it from, and every node checked for what a verl
        job needs: packages, flash-attn when the cells use it, the entrypoint's Python, the model and
        data paths, the MLflow store (one sentence if not)."""
        job = verl_job(spec, runs[0])
        write_package_copy(spec)
        runtime_env = job.runtime_env("check")
        runtime_env["env_vars"].update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_TIMEOUT="10")
        needs = node_needs([run.config for run in runs], REQUIREMENTS, job.env["MLFLOW_TRACKING_URI"], spec.name)
        check_cluster(runtime_env, needs)

    def time_limits(self, spec: ExperimentSpec, runs: list[PlannedRun]) -> dict[str, TimeLimit]:
        """Each job's from its estimate unless the spec sets run_timeout_s (`verl_plan.time_limit`)."""
        return time_limits(spec, runs)

    def retries(self, error: str, timed_out: bool) -> bool:
        """A job lost (`job_failures.JobLost`), timed out, or a watcher that failed before its job ended
        is resubmitted from the run's last checkpoint; a job whose verl failed (`JobFailed`) is not."""
        return timed_out or not error.startswith(REAL_FAILURE)


BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (BuiltinBackend(), VerlBackend())}
"""``TrainerConfig.backend`` -> its backend; the field's literal names exactly these."""


def backend_named(name: str) -> Backend:
    """The backend of that name (KeyError for a name the config's literal does not allow)."""
    return BACKENDS[name]


def backend_of(config: TrainerConfig | Mapping[str, Any]) -> Backend:
    """The backend a trainer config (or its dict, as a task receives it) runs on."""
    if isinstance(config, TrainerConfig):
        return BACKENDS[config.backend]
    return BACKENDS[config.get("backend") or TrainerConfig.model_fields["backend"].default]


def runs_by_backend(plan: Plan) -> list[tuple[Backend, list[PlannedRun]]]:
    """The plan's runs grouped by their backend: backends in `BACKENDS` order, runs in plan order."""
    groups = {backend: [run for run in plan.runs if backend_of(run.config) is backend] for backend in BACKENDS.values()}
    return [(backend, runs) for backend, runs in groups.items() if runs]


def check_backends(spec: ExperimentSpec, plan: Plan) -> None:
    """Each backend's `Backend.check` of its runs (`validate` and `run`, whatever cell function runs them)."""
    for backend, runs in runs_by_backend(plan):
        backend.check(spec, runs)


def time_limits_of(spec: ExperimentSpec, plan: Plan) -> dict[str, TimeLimit]:
    """Run id -> the time limit its backend gives it (a run left out: ``executor.run_timeout_s``)."""
    return {run_id: limit for backend, runs in runs_by_backend(plan) for run_id, limit in backend.time_limits(spec, runs).items()}


def jobs_at_once(plan: Plan) -> int | None:
    """Most runs in flight at once that the plan's backends allow (None: no limit of their own)."""
    limits = [limit for backend, runs in runs_by_backend(plan) if (limit := backend.jobs_at_once(runs)) is not None]
    return min(limits) if limits else None


def plan_texts(spec: ExperimentSpec, plan: Plan) -> list[str]:
    """What the plan's backends add to `validate`'s printout (e.g. every verl job and its estimate)."""
    return [text for backend, runs in runs_by_backend(plan) if (text := backend.plan_text(spec, runs))]


def estimate_note(plan: Plan) -> str | None:
    """The compute line of the base trainer's backend in place of the CPU-scaled time (`Backend.estimate_note`)."""
    return backend_of(plan.spec.trainer).estimate_note
