"""A cell as a Ray job (Ray's Job Submission API): submitted, re-attached after a driver's death,
its failure reported with its log tail.

`job_cell` is a cell function (``DAPO_ABLATE_CELL_FN=dapo_ablate.ablation.runtime.jobs:job_cell``; the
executor runs it in a Ray task of a driver joined to the cluster). It submits the cell as a Ray job
whose entrypoint is the cell's trainer -- the built-in trainer (``python -m
dapo_ablate.ablation.runtime.cell``, its result printed as the last line of the job's log, with a
runtime environment holding the config) or verl's ``main_ppo`` exactly as the driver built it
(`backends.verl_job.VerlJob`, handed over in ``$DAPO_ABLATE_VERL_JOB``: entrypoint, environment,
shipped package, the entrypoint's CPUs and no GPU: verl's placement groups hold the GPUs), then
waits for it.

A Ray job belongs to the cluster, not to the driver: when the driver is killed, the job keeps
running. Its submission id is a pure function of the run (``dapo-ablate-<experiment>-<run id>-a<n>``),
so a rerun that claims the run again finds the job and re-attaches to it (running: waits; finished:
reads its result; failed while nobody watched: reports that failure) instead of starting it again.
A failure is raised once with the tail of the job's log, as `JobLost` when the job was lost with a
node or its supervisor (`job_failures`), else `JobFailed`; the retry that follows submits attempt
n + 1 (a verl job resumes from the run's last checkpoint, without verl's validation before training
when there is one: `verl_checkpoints.resumed_entrypoint`; only from checkpoints the run's own jobs
wrote: the task seals them while it watches a job and when the job ends, and sets aside anything
else in the run's checkpoint folder before each submission, the first included, with a note:
`verl_seal`; the run's ``wall_s`` adds up the jobs of all
its attempts: `attempts_wall_s`). A job the driver stopped (`stop_job`: the run timed out or was pruned) had
its end recorded by the driver, so the next attempt is submitted at once. The submission id is
sent to the driver (``on_event("job", ...)``, which writes it to the ledger) and written to
``job.json`` in the run's folder.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

from dapo_ablate.ablation.runtime.backends.job_failures import JobFailed, JobLost, lost_reason
from dapo_ablate.ablation.runtime.backends.registry import backend_of
from dapo_ablate.ablation.runtime.backends.verl_checkpoints import resumed_entrypoint
from dapo_ablate.ablation.runtime.backends.verl_job import JOB_ENV, VerlJob
from dapo_ablate.ablation.runtime.backends.verl_results import result_from_mlflow
from dapo_ablate.ablation.runtime.backends.verl_seal import CheckpointSeal
from dapo_ablate.ablation.runtime.joblog import log_tail
from dapo_ablate.core.atomic import own_folder, write_text
from dapo_ablate.core.config import ConfigError, build_trainer_config
from dapo_ablate.core.seals import UNKEYED

RESULT_MARKER = "DAPO_ABLATE_RESULT "
MLFLOW_RUN_ENV = "DAPO_ABLATE_MLFLOW_RUN_ID"  # the cell's MLflow child run (set by the driver: pool.MLFLOW_RUN_ENV)
CONFIG_ENV = "DAPO_ABLATE_JOB_CONFIG"
SEAL_ENV = "DAPO_ABLATE_SEAL_KEY"
"""In a task's environment: the experiment's worker key (hex; `pool.worker_env`), which seals the
run's checkpoints and cached evaluations (`core.seals`)."""
ADDRESS_ENV = "DAPO_ABLATE_JOBS_ADDRESS"
GPUS_ENV = "DAPO_ABLATE_JOB_GPUS"
CPUS_ENV = "DAPO_ABLATE_JOB_CPUS"
"""A failure's log tail is at most this long: it goes into one line of the ledger's error."""
STOP_WAIT_S = 60.0
"""`stop_job` waits at most this long for a stopped job to end (Ray's SIGKILL comes after 3 s)."""
POLL_S = 1.0
AGENT_WAIT_S = 600.0  # a head just started (or a loaded one) may take minutes to bring its job agent up
ACTIVE = ("PENDING", "RUNNING")


def seal_key() -> bytes | None:
    """The experiment's worker key the driver put in this task's environment (`SEAL_ENV`), or None
    (a run outside an experiment)."""
    text = os.environ.get(SEAL_ENV, "")
    try:
        return bytes.fromhex(text) or None
    except ValueError:
        raise RuntimeError(f"${SEAL_ENV} is not a hex key; `dapo-ablate run` sets it") from None


def checkpoint_seal(config: dict[str, Any], run_dir: str) -> CheckpointSeal | None:
    """The seal of the run's checkpoints, for a backend whose jobs save into the run's folder (verl:
    `Backend.checkpoint_folder`; None for the built-in trainer, which seals its own, and for a
    user's ``trainer.default_local_dir``, not ours), under the experiment's worker key."""
    try:
        trainer = build_trainer_config(config)
    except ConfigError:  # the job fails on it, and its log says why: there is nothing of it to resume
        return None
    folder = backend_of(config).checkpoint_folder(trainer, Path(run_dir))
    if folder is None:
        return None
    return CheckpointSeal(folder, Path(run_dir).name, trainer.digest(), seal_key() or UNKEYED)


def dashboard_address() -> str:
    """The joined cluster's Job API address: $DAPO_ABLATE_JOBS_ADDRESS, else the dashboard URL the
    head publishes in Ray's internal key-value store (read from inside a Ray worker)."""
    if os.environ.get(ADDRESS_ENV):
        return os.environ[ADDRESS_ENV]
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    url = _internal_kv_get(ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
    if not url:
        raise RuntimeError(f"the Ray cluster has no dashboard (the Job API); start its head with the dashboard or set {ADDRESS_ENV}")
    url = url.decode() if isinstance(url, bytes) else str(url)
    return url if url.startswith("http") else f"http://{url}"


def submission_ids(run_dir: str) -> tuple[str, Path]:
    """(id prefix of the run's jobs, the run's job.json) from ``<output_dir>/<experiment>/<run id>``."""
    folder = Path(run_dir)
    return f"dapo-ablate-{folder.parent.name}-{folder.name}", folder / "job.json"


def builtin_entrypoint(run_dir: str, eval_cache_dir: str | None) -> str:
    return " ".join(shlex.quote(word) for word in (sys.executable, "-m", "dapo_ablate.ablation.runtime.cell", run_dir, eval_cache_dir or ""))


def job_cell(
    config: dict[str, Any], run_dir: str, eval_cache_dir: str | None,
    on_event: Callable[[str, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run one cell as a Ray job (submitting it, or re-attaching to the one already submitted).

    ``on_event("job", 0, {"submission_id", "address"})`` tells the driver which job the run is,
    once it is submitted or found, before waiting for it.
    """
    from ray.job_submission import JobSubmissionClient

    address = dashboard_address()
    client = JobSubmissionClient(address)
    prefix, record = submission_ids(run_dir)
    own_folder(run_dir)
    attempt = 1
    while True:
        sid = f"{prefix}-a{attempt}"
        info = _job_info(client, sid)
        reported = Path(run_dir) / f"{sid}.reported"
        status = _status(info.status) if info is not None else None
        if status == "STOPPED" or (status == "FAILED" and reported.exists()):
            attempt += 1  # its end is on record (by `stop_job`'s caller, or reported): this is the retry
            continue
        break
    seal = checkpoint_seal(config, run_dir)
    if info is None:
        note = seal.secure() if seal is not None else None  # the job resumes only from what the run's jobs wrote
        if note and on_event is not None:
            on_event("note", 0, {"message": note})
        _submit(client, sid, config, run_dir, eval_cache_dir)
    write_text(record, json.dumps({"submission_id": sid, "attempt": attempt, "address": address}))
    if on_event is not None:
        on_event("job", 0, {"submission_id": sid, "address": address})
    status = _wait(client, sid, seal)
    logs = client.get_job_logs(sid)
    if status != "SUCCEEDED":
        write_text(reported, status)
        raise _job_error(client, sid, status, logs)
    if backend_of(config).job_from_driver:  # verl: the job logged into the run's MLflow child
        job = _verl_job()
        return result_from_mlflow(job.env["MLFLOW_TRACKING_URI"], _mlflow_run_id(),
                                  wall_s=attempts_wall_s(client, prefix, attempt), config=config, job_log=logs)
    return result_from_logs(logs, sid)


def _job_error(client: Any, sid: str, status: str, logs: str) -> JobFailed:
    """`JobLost` if the job was lost with a node or its supervisor (`job_failures.lost_reason`), else `JobFailed`."""
    info = _job_info(client, sid)
    lost = lost_reason(getattr(info, "error_type", None), getattr(info, "driver_exit_code", None), logs)
    why = f" ({lost})" if lost else ""
    return (JobLost if lost else JobFailed)(f"Ray job {sid} ended {status}{why}; last lines of its log: {log_tail(logs)}")


def stop_job(submission_id: str, wait_s: float = STOP_WAIT_S) -> bool:
    """Stop the Ray job `submission_id` on the joined cluster (a run that timed out or was
    pruned; a lost lease leaves it running: the driver that took the run re-attaches to it); True if it was running. Waits up to `wait_s` until Ray reports it ended (Ray
    sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S, 3 s by default), so that a retry
    claimed right after finds it STOPPED and submits the next attempt. Not for Ctrl-C or a driver's
    death: those leave the job running for a rerun to re-attach to."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(dashboard_address())
    if _job_info(client, submission_id) is None:
        return False
    stopped = bool(client.stop_job(submission_id))
    deadline = time.monotonic() + wait_s
    while _status(client.get_job_status(submission_id)) in ACTIVE and time.monotonic() < deadline:
        time.sleep(POLL_S / 4)
    return stopped


def _job_info(client: Any, sid: str) -> Any:
    try:
        return client.get_job_info(sid)
    except RuntimeError as err:  # the Job API answers 404 as RuntimeError("... does not exist")
        if "does not exist" in str(err) or "404" in str(err):
            return None
        raise


def _verl_job() -> Any:
    """The cell's verl job, built by the driver (`backends.verl_job`; what a dry run prints)."""
    if not os.environ.get(JOB_ENV):
        raise RuntimeError(f"a verl cell needs its job in ${JOB_ENV}; `dapo-ablate run` sets it")
    return VerlJob.from_json(os.environ[JOB_ENV])


def _mlflow_run_id() -> str:
    run_id = os.environ.get(MLFLOW_RUN_ENV)
    if not run_id:
        raise RuntimeError(f"a verl cell needs the cell's MLflow child run in ${MLFLOW_RUN_ENV}; `dapo-ablate run` sets it")
    return run_id


def _submit(client: Any, sid: str, config: dict[str, Any], run_dir: str, eval_cache_dir: str | None) -> None:
    if backend_of(config).job_from_driver:
        # the job as the driver built it (verl's); its GPUs are verl's own placement groups, not the entrypoint's
        # a retry that resumes from the run's checkpoint skips verl's validation before training
        job = _verl_job()
        entrypoint = resumed_entrypoint(job.entrypoint, build_trainer_config(config), run_dir)
        runtime_env, cpus, gpus = job.runtime_env(_mlflow_run_id()), job.num_cpus, 0.0
    else:
        env = {CONFIG_ENV: json.dumps(config), "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
               SEAL_ENV: os.environ.get(SEAL_ENV, "")}
        entrypoint, runtime_env = builtin_entrypoint(run_dir, eval_cache_dir), {"env_vars": env}
        cpus, gpus = float(os.environ.get(CPUS_ENV, "1")), float(os.environ.get(GPUS_ENV, "0"))
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            client.submit_job(
                entrypoint=entrypoint, submission_id=sid, runtime_env=runtime_env,
                entrypoint_num_cpus=cpus, entrypoint_num_gpus=gpus, metadata={"dapo_ablate_run_dir": run_dir},
            )
            return
        except RuntimeError as err:  # a head just started has no job agent yet ("try again later")
            if "try again later" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)


def _status(status: Any) -> str:
    """``JobStatus.RUNNING`` (or "RUNNING") -> "RUNNING"."""
    return str(status).rsplit(".", 1)[-1]


def _wait(client: Any, sid: str, seal: CheckpointSeal | None = None) -> str:
    """The job's final status; meanwhile the checkpoints it writes are sealed as they appear, and
    once more when it has ended, whatever its outcome (`seal`: the run's, if it has one)."""
    seen = None
    while True:
        status = _status(client.get_job_status(sid))
        if status not in ACTIVE:
            if seal is not None:
                seal.observe()
            return status
        if seal is not None:
            seen = seal.observe(seen)
        time.sleep(POLL_S)


def _job_wall_s(info: Any) -> float | None:
    """Seconds from the job's start to its end (Ray's JobInfo times are in milliseconds)."""
    start, end = getattr(info, "start_time", None), getattr(info, "end_time", None)
    return (end - start) / 1000.0 if start and end else None


def attempts_wall_s(client: Any, prefix: str, attempts: int) -> float | None:
    """Seconds of the jobs of attempts 1..`attempts` of one run, added up: a verl run resumed from
    its checkpoint by attempt n trained in all of them (its last job alone may be a quarter of its
    time). An attempt whose job Ray no longer knows, or that has no end, adds nothing."""
    known = [wall for n in range(1, attempts + 1)
             if (info := _job_info(client, f"{prefix}-a{n}")) is not None and (wall := _job_wall_s(info)) is not None]
    return sum(known) if known else None


def result_from_logs(logs: str, sid: str) -> dict[str, Any]:
    for line in reversed(logs.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    raise JobFailed(f"Ray job {sid} succeeded but printed no result line ({RESULT_MARKER.strip()}); "
                    f"last lines of its log: {log_tail(logs)}")
