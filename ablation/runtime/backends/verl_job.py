"""A verl cell's Ray job, built in one place: what ``run --dry-run`` prints is what is submitted.

`verl_job(spec, run)` gives the job's entrypoint (verl's ``main_ppo`` with the cell's overrides),
its environment and its shape. The driver hands it to the task that submits the job as JSON
(`JOB_ENV`), and ``validate`` / ``run --dry-run`` print the same object, so a test can compare the
printed entrypoint with the one the cluster received.

Resources: the job's entrypoint (verl's driver) asks for ``executor.cpus_per_run`` CPUs and no
GPU; verl's own resource pool then places ``nnodes x gpus_per_node`` GPU workers as placement
groups across nodes. The Ray task that submits and watches the job holds nothing (a task lives on
one node: one that asked for the job's 128 GPUs could never be scheduled).

The job's runtime environment ships this package (``py_modules``: verl imports our Overlong
Filtering loss in every worker) from a copy in the experiment's run folder (shared storage on a
cluster, where the submitting task runs), and declares the Python the cluster must already have
(`REQUIREMENTS`, checked on every node before any cell is submitted: `verl_cluster`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.runtime.backends.verl import job_env, job_shape, verl_command, verl_overrides
from dapo_ablate.ablation.experiment.spec import run_root
from dapo_ablate.ablation.store.tracking import absolute_tracking_uri

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import PlannedRun
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

JOB_ENV = "DAPO_ABLATE_VERL_JOB"
"""The submitting task's environment variable holding its `VerlJob` as JSON."""
MLFLOW_RUN_ID = "MLFLOW_RUN_ID"
PACKAGE = "dapo_ablate"
SUBPACKAGES = ("core", "ablation", "sweeps", "reports", "cli")
REQUIREMENTS = {
    "verl": "==0.9.1",
    "TransferQueue": ">=0.1.11",
    "mlflow": ">=3.0,<3.18",
    "vllm": ">=0.8.5",
    "torch": ">=2.4",
}
"""What each node's Python must have for a verl cell (the ``verl`` extra of this package installs it;
``vllm`` is the CUDA build on GPU nodes)."""


@dataclass(frozen=True)
class VerlJob:
    """One verl cell's Ray job."""

    run_name: str
    entrypoint: str
    """The shell command the job runs: ``python3 -m verl.trainer.main_ppo`` and the overrides."""
    env: dict[str, str]
    """The job's environment variables, except ``MLFLOW_RUN_ID`` (the cell's MLflow child run,
    created by the driver just before the job is submitted)."""
    num_cpus: float
    """CPUs of the entrypoint (verl's driver process); its GPUs: none."""
    nnodes: int
    gpus_per_node: int
    py_modules: list[str] = field(default_factory=list)
    """Local folders shipped to every worker (this package)."""

    @property
    def gpus(self) -> int:
        return self.nnodes * self.gpus_per_node

    def runtime_env(self, mlflow_run_id: str) -> dict[str, Any]:
        """The job's Ray runtime environment, the cell's MLflow child run filled in."""
        env = {**self.env, MLFLOW_RUN_ID: mlflow_run_id}
        return {"env_vars": env, **({"py_modules": list(self.py_modules)} if self.py_modules else {})}

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "VerlJob":
        return cls(**json.loads(text))


def package_copy(spec: ExperimentSpec) -> Path:
    """Where the experiment's copy of this package is shipped from (``<run folders>/.package``)."""
    return run_root(spec) / ".package" / PACKAGE


def verl_job(spec: ExperimentSpec, run: PlannedRun, ship: bool = True) -> VerlJob:
    """The Ray job of one verl run (raises VerlTranslationError, one sentence, for what verl cannot
    do). `ship`: name the package copy in py_modules (written by `write_package_copy`)."""
    executor = spec.executor
    nnodes, per_node = job_shape(executor.gpus_per_run, executor.gpus_per_node)
    overrides = verl_overrides(run.config, nnodes=nnodes, gpus_per_node=per_node, project=spec.name,
                               run_name=run.name, run_dir=str(run_root(spec) / run.run_id))
    return VerlJob(
        run_name=run.name, entrypoint=verl_command(overrides),
        env=job_env(run.config, absolute_tracking_uri(spec.tracking.uri)),
        num_cpus=executor.cpus_per_run, nnodes=nnodes, gpus_per_node=per_node,
        py_modules=[str(package_copy(spec))] if ship else [],
    )


def write_package_copy(spec: ExperimentSpec) -> Path:
    """Copy this package's source (no caches) to `package_copy(spec)`, replacing an older copy;
    Ray uploads it with each job (once per content: it is hashed)."""
    target = package_copy(spec)
    staging = target.with_name(f".{PACKAGE}.new")
    shutil.rmtree(staging, ignore_errors=True)
    for name in SUBPACKAGES:
        shutil.copytree(_subpackage_dir(name), staging / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _subpackage_dir(name: str) -> Path:
    import importlib

    module = importlib.import_module(f"{PACKAGE}.{name}")
    return Path(list(module.__path__)[0])
