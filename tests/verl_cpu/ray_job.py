"""The same verl DAPO job as ``run_job.py``, submitted as a Ray *job* (Job Submission API) to a
private Ray head with a fake GPU, as the verl backend of dapo-ablate runs each cell.

    .venv-verl/bin/python tests/verl_cpu/ray_job.py --workdir /tmp/verl-cpu-job

The head: ``ray start --head --num-cpus=16 --num-gpus=1 --temp-dir=<private>`` on free ports,
token authentication with a private token file. Its environment is this one with the venv's
``bin`` first on PATH (the entrypoint's ``python3``); ``CPU_ENV`` and MLflow travel in the job's
``runtime_env.env_vars``. The job's overrides are ``dapo_overrides`` + ``CPU_OVERRIDES`` (no
``local_ray_overrides``: the driver connects to the running cluster). Everything the head and the
job started is ended afterwards by the run marker (:func:`fixtures.cleanup_run`), never
``ray stop``. Writes ``<workdir>/report.json`` like ``run_job.py``, plus the head's start-up time.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `verl_cpu` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl_cpu.fixtures import (  # noqa: E402
    CPU_ENV,
    CPU_OVERRIDES,
    RUN_MARKER_VAR,
    RunWatch,
    new_run_marker,
    write_json,
)
from verl_cpu.run_job import (  # noqa: E402
    MAX_RESPONSE_LEN,
    PROJECT_LOSS,
    PROJECT_LOSS_ENV,
    PROJECT_LOSS_MODULE,
    dapo_overrides,
    prepare_workdir,
    mlflow_contents,
)

VENV_BIN = Path(sys.executable).parent
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_head(root: Path, env: dict[str, str], timeout_s: float = 300) -> tuple[str, float]:
    """``ray start --head`` (returns once the head is up) with its temp dir under ``root`` and
    every port it would otherwise take from a fixed default chosen free; returns the dashboard's
    address (the Job API) and the start-up seconds."""
    dashboard_port = free_port()
    command = [
        str(VENV_BIN / "ray"), "start", "--head", "--num-cpus=16", "--num-gpus=1",  # blocker 2: a fake GPU
        f"--temp-dir={root / 'ray'}", f"--port={free_port()}", "--node-ip-address=127.0.0.1",
        f"--dashboard-port={dashboard_port}", "--dashboard-host=127.0.0.1",
        f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
        "--disable-usage-stats",
    ]
    start = time.monotonic()
    subprocess.run(command, env=env, check=True, timeout=timeout_s, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   start_new_session=True)
    return f"http://127.0.0.1:{dashboard_port}", time.monotonic() - start


def wait_for_job(client, submission_id: str, timeout_s: float) -> str:
    """Poll until the job is terminal; stop it at the timeout (returns TIMEOUT then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = str(client.get_job_status(submission_id)).rsplit(".", 1)[-1]
        if status in TERMINAL:
            return status
        time.sleep(2)
    client.stop_job(submission_id)
    return "TIMEOUT"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="hard limit of the job, seconds")
    parser.add_argument("--project-loss", action="store_true")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="more job environment")
    parser.add_argument("extra", nargs="*", help="more Hydra overrides, applied last")
    args = parser.parse_args(argv)

    workdir = args.workdir.resolve()
    model, train, val, reward_path, reward_name, tracking_uri, run_id = prepare_workdir(workdir)

    marker = new_run_marker()
    root = Path(f"/tmp/vcj_{marker}")  # short: Ray's socket paths live under it
    root.mkdir()
    token_file = root / "token"
    token_file.write_text(secrets.token_hex(32))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    head_env = {**os.environ, **auth, RUN_MARKER_VAR: marker,
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    head_env.pop("RAY_AUTH_TOKEN", None)
    head_env.pop("RAY_ADDRESS", None)

    loss_mode = PROJECT_LOSS if args.project_loss else "vanilla"
    overrides = dapo_overrides(model, train, val, reward_path, reward_name, steps=args.steps, loss_mode=loss_mode,
                               run_name=workdir.name) + CPU_OVERRIDES + args.extra
    entrypoint = shlex.join(["python3", "-m", "verl.trainer.main_ppo", *overrides])
    job_env = {**CPU_ENV, "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_RUN_ID": run_id}
    if args.project_loss:
        job_env.update({"VERL_USE_EXTERNAL_MODULES": PROJECT_LOSS_MODULE, PROJECT_LOSS_ENV: str(MAX_RESPONSE_LEN)})
    job_env.update(item.split("=", 1) for item in args.env)
    (workdir / "entrypoint.txt").write_text(entrypoint + "\n")

    os.environ.update(auth)  # the Job API client below authenticates with the head's token
    status, timings = "NOT_STARTED", {}
    start = time.monotonic()
    watch = RunWatch(marker, str(root))
    try:
        with watch:
            address, timings["head_start_s"] = start_head(root, head_env)
            from ray.job_submission import JobSubmissionClient

            client = JobSubmissionClient(address)
            submission_id = f"verl-cpu-{marker}"
            submitted = time.monotonic()
            client.submit_job(entrypoint=entrypoint, submission_id=submission_id,
                              runtime_env={"env_vars": job_env})
            status = wait_for_job(client, submission_id, args.timeout)
            timings["job_s"] = time.monotonic() - submitted
            (workdir / "job.log").write_text(client.get_job_logs(submission_id))
    finally:  # the head and everything the job started; never `ray stop` (other clusters run here)
        timings["total_s"] = time.monotonic() - start
        leftovers = watch.cleanup()
    report = {
        "job": {"status": status, **{k: round(v, 1) for k, v in timings.items()},
                "peak_pss_gib": round(watch.peak_pss_bytes / 2**30, 2), "peak_processes": watch.peak_processes,
                "ended_after": len(leftovers.killed), "removed_segments": leftovers.removed_segments},
        "entrypoint": entrypoint, "runtime_env_vars": job_env,
        "mlflow": mlflow_contents(tracking_uri, run_id),
    }
    write_json(workdir / "report.json", report)
    if status == "SUCCEEDED":
        shutil.rmtree(root, ignore_errors=True)
    print(report["job"], f"{len(report['mlflow']['metrics'])} metrics", sep="\n")
    return 0 if status == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
