"""The spec sections every experiment and sweep shares: where runs execute (`ExecutorSpec`) and
where MLflow records them (`TrackingSpec`). Split from `spec` by responsibility; `spec` re-exports
both, so their import path is unchanged."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_TRACKING_URI = "sqlite:///dapo-runs/mlflow.db"


class Section(BaseModel):
    """A spec section: frozen, unknown keys refused, defaults validated, no NaN or infinity."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)


class ExecutorSpec(Section):
    """Where and how many runs execute (Ray)."""

    address: str | None = None
    """Ray cluster address to join (`ray://host:10001` or `auto`); None: start a local Ray."""
    auth_token_file: str | None = None
    """File holding the joined cluster's Ray authentication token (the head's ~/.ray/auth_token;
    Ray 2.5x heads use token authentication when a token exists). None: RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token. Only read when the cluster asks for a token."""
    cpus_per_run: float = Field(1.0, ge=0)
    """CPUs each run declares to Ray (match the trainer's model.threads on CPU); backend verl: the
    CPUs of the job's entrypoint (verl's driver process)."""
    gpus_per_run: float = Field(0.0, ge=0)
    """GPUs each run uses. Built-in trainer: what its Ray task declares (fractions share a GPU).
    backend verl: the GPUs of the cell's verl job, a whole number on one node or on whole nodes
    (trainer.nnodes x trainer.n_gpus_per_node); the job's own placement groups hold them, the task
    that submits and watches the job holds none."""
    gpus_per_node: int = Field(8, ge=1)
    """backend verl: GPUs per node of the cluster; a job of more GPUs than this spans
    gpus_per_run / gpus_per_node whole nodes."""
    max_concurrent: int | None = Field(None, ge=1)
    """Most runs at a time; None: as many as the CPUs (or the cluster's resources) allow. backend verl:
    each job has its own TransferQueue (its own Ray namespace), so any number; at most 1 for cells whose
    trainer.verl.overrides set a TransferQueue backend other than SimpleStorage or a fixed metrics port."""
    retries: int = Field(1, ge=0)
    """A failed run is re-tried until it has had retries + 1 attempts in all, counted across
    invocations (a rerun does not reset them); `dapo-ablate run --retry-failed` gives failed runs a
    fresh budget on purpose. backend verl: only a job lost (a node died or was preempted, the job's
    supervisor died, or it ran past its time limit) is resubmitted, from its last checkpoint; a job
    whose verl exited non-zero is a real failure and is not retried."""
    lease_s: float = Field(120.0, gt=0)
    """A running run whose driver stopped heartbeating this long ago may be taken over."""
    checkpoints_when_done: Literal["all", "final", "none"] = "all"
    """backend verl: the checkpoints a run keeps in its folder once it is done (while it trains,
    trainer.verl.max_checkpoints bounds them): ``all`` (verl's), ``final`` (the last step's only:
    the trained policy), ``none`` (a done run is never resumed). Applied by the driver when it
    records the run's result, to the run folder's own ``checkpoints/global_step_<n>`` folders only."""
    run_timeout_s: float | None = Field(259200.0, gt=0)
    """Wall-clock limit of one run (default 72 h, above a 32B DAPO run on a node), counted from its
    start on a Ray worker (a run that is a Ray job: from the job's submission); past it the run's
    task is cancelled, the run recorded failed with that reason and its slot freed (backend builtin:
    not retried, it would hang again). None: no limit. backend verl, when the spec does not set it:
    each cell's limit is its own estimated wall time x 3 + 1 h of start-up (``validate`` prints it per
    cell; a spec that sets it, null included, puts every cell under it); a verl job past its limit is
    stopped and resubmitted from its last checkpoint within ``retries``."""

    @property
    def run_timeout_given(self) -> bool:
        """Whether the spec sets ``run_timeout_s`` itself (then it holds for verl cells too)."""
        return "run_timeout_s" in self.model_fields_set


class TrackingSpec(Section):
    """Where MLflow records the experiment."""

    uri: str = DEFAULT_TRACKING_URI
    """MLflow tracking URI: a SQLite database (default, under dapo-runs/) or a tracking server."""
    artifact_location: str | None = None
    """Artifact root of the MLflow experiment; None: MLflow's default (beside the SQLite store)."""
