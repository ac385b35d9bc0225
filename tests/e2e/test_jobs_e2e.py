"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_jobs.py
describes; its docstring says what they check."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapo_ablate.ablation.runtime.jobs import submission_ids
from dapo_ablate.ablation.runtime.reaper import kill_session
from dapo_ablate.ablation.store.ledger import SQLLedger

from support import HANG_GUARD_S
from test_ray_cluster import Head, client_env, done_runs, short_root, write_spec  # noqa: F401 - fixture
from tiny_configs import TINY_TRAINER

BIN = Path(sys.executable).parent

LIST_JOBS = (
    "import json, sys\n"
    "from ray.job_submission import JobSubmissionClient\n"
    "jobs = JobSubmissionClient(sys.argv[1]).list_jobs()\n"
    "print(json.dumps([[j.submission_id, str(j.status).rsplit('.', 1)[-1]] for j in jobs if j.submission_id]))\n"
)


def list_jobs(head: Head) -> list[list[str]]:
    result = subprocess.run([sys.executable, "-c", LIST_JOBS, f"http://127.0.0.1:{head.dashboard_port}"],
                            env=head.env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


JOB_LOGS = (
    "import sys\n"
    "from ray.job_submission import JobSubmissionClient\n"
    "print(JobSubmissionClient(sys.argv[1]).get_job_logs(sys.argv[2])[-3000:])\n"
)


def wait_for_a_job(head: Head, driver: subprocess.Popen) -> None:
    """Until one of the driver's jobs runs (or has already succeeded, on a fast machine); a job that
    fails or is stopped first, or a driver that exits, fails the test at once with its log. The
    only bound is one for a broken cluster: a loaded machine's job agent may take minutes."""
    deadline = time.monotonic() + 900
    while True:
        jobs = list_jobs(head)
        if any(status in ("RUNNING", "SUCCEEDED") for _, status in jobs):
            return
        ended = [(sid, status) for sid, status in jobs if status in ("FAILED", "STOPPED")]
        if ended:
            logs = subprocess.run([sys.executable, "-c", JOB_LOGS, f"http://127.0.0.1:{head.dashboard_port}", ended[0][0]],
                                  env=head.env, capture_output=True, text=True, timeout=HANG_GUARD_S)
            pytest.fail(f"job {ended[0][0]} ended {ended[0][1]} before running: {logs.stdout}{logs.stderr[-1000:]}")
        if driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the driver exited ({driver.returncode}) before any job ran: {out[-1500:]} {err[-1500:]}")
        assert time.monotonic() < deadline, f"no Ray job ran within 900 s: {jobs}"
        time.sleep(0.5)


def start_driver(spec: Path, head: Head) -> subprocess.Popen:
    env = client_env(head, RAY_AUTH_TOKEN_PATH=str(head.token_file), DAPO_ABLATE_CELL_FN="dapo_ablate.ablation.runtime.jobs:job_cell")
    return subprocess.Popen([str(BIN / "dapo-ablate"), "run", str(spec), "--no-progress", "--address", head.address],
                            cwd=spec.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


LIFECYCLE = r"""
import json, sys, time
import ray
from ray.job_submission import JobSubmissionClient
from dapo_ablate.ablation.runtime.jobs import JobFailed, dashboard_address, job_cell, stop_job, submission_ids

out = sys.argv[2]
ray.init(address=sys.argv[1])  # a driver joined to the cluster: dashboard_address() asks the head
report = {"events": []}
on_event = lambda *event: report["events"].append(event)
broken = {"backend": "builtin", "no_such_field": 1}  # the job's trainer refuses it and exits 1
try:
    job_cell(broken, f"{out}/exp/broken", None, on_event=on_event)
except JobFailed as err:
    report["failed"] = str(err)
try:  # the driver's retry: that failure was reported, so attempt 2 is submitted
    job_cell(broken, f"{out}/exp/broken", None, on_event=on_event)
except JobFailed as err:
    report["failed_again"] = str(err)

client = JobSubmissionClient(dashboard_address())
sid = submission_ids(f"{out}/exp/sleeper")[0] + "-a1"  # what job_cell submits first for that run
client.submit_job(entrypoint=f"{sys.executable} -c 'import time; time.sleep(600)'", submission_id=sid)
while str(client.get_job_status(sid)).rsplit(".", 1)[-1] != "RUNNING":
    time.sleep(0.2)
report["stopped"] = stop_job(sid)
report["status"] = str(client.get_job_status(sid)).rsplit(".", 1)[-1]
report["stopped_again"] = stop_job(sid)
report["stopped_unknown"] = stop_job("dapo-ablate-no-such-job")
try:  # the retry of the run whose job was stopped: a new attempt, not the stopped one re-reported
    job_cell(broken, f"{out}/exp/sleeper", None, on_event=on_event)
except JobFailed as err:
    report["retried"] = str(err)
print(json.dumps(report))
"""


@pytest.mark.slow
def test_sigkill_of_the_driver_while_a_job_runs_then_rerun_reattaches_and_records_each_cell_once(short_root: Path, tmp_path: Path):
    head = Head(short_root, dashboard=True)
    try:
        trainer = {**TINY_TRAINER, "schedule": {**TINY_TRAINER["schedule"], "total_steps": 16, "eval_every": 8}}
        spec = write_spec(tmp_path, trainer, cpus_per_run=0)

        driver = start_driver(spec, head)
        wait_for_a_job(head, driver)
        kill_session(driver.pid)  # SIGKILL of the driver and everything in its session
        driver.wait(timeout=HANG_GUARD_S)
        assert driver.returncode == -signal.SIGKILL
        # the job outlives its driver: still running, or (on a slow, busy machine) already finished
        survivors = list_jobs(head)
        assert survivors and all(status in ("PENDING", "RUNNING", "SUCCEEDED") for _, status in survivors), survivors

        rerun = start_driver(spec, head)
        out, err = rerun.communicate(timeout=900)
        kill_session(rerun.pid)
        assert rerun.returncode == 0, err[-3000:]

        assert done_runs(spec) == 2
        jobs = list_jobs(head)
        assert len(jobs) == 2 and all(status == "SUCCEEDED" for _, status in jobs)
        assert all(sid.endswith("-a1") for sid, _ in jobs)  # never submitted a second time
        out_dir = tmp_path / "out" / "ray-cluster"
        recorded = {json.loads((folder / "job.json").read_text())["submission_id"] for folder in out_dir.iterdir() if (folder / "job.json").is_file()}
        assert recorded == {sid for sid, _ in jobs}
        with SQLLedger(f"sqlite:///{tmp_path / 'out' / 'ledger.db'}") as ledger:  # the driver wrote each run's job
            rows = ledger.runs_table("ray-cluster")
        assert {row["job_id"] for row in rows} == recorded
        assert all(row["job_id"] == submission_ids(str(out_dir / row["run_id"]))[0] + "-a1" for row in rows)

        from mlflow import MlflowClient

        from dapo_ablate.ablation.store.tracking import RUN_ID_TAG

        client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("ray-cluster")
        children: dict[str, int] = {}
        for run in client.search_runs([experiment.experiment_id]):
            if RUN_ID_TAG in run.data.tags:
                children[run.data.tags[RUN_ID_TAG]] = children.get(run.data.tags[RUN_ID_TAG], 0) + 1
        assert len(children) == 2 and set(children.values()) == {1}
    finally:
        head.stop()


@pytest.mark.slow
def test_a_run_past_its_timeout_has_its_job_stopped_and_its_job_id_in_the_ledger(short_root: Path, tmp_path: Path):
    head = Head(short_root, dashboard=True)
    try:
        trainer = {**TINY_TRAINER, "schedule": {**TINY_TRAINER["schedule"], "total_steps": 100_000, "eval_every": 0}}
        # counted from each job's submission, however long a loaded machine takes to start the Ray worker that submits it
        spec = write_spec(tmp_path, trainer, cpus_per_run=0, run_timeout_s=15)
        driver = start_driver(spec, head)
        out, err = driver.communicate(timeout=900)
        kill_session(driver.pid)
        jobs = dict(list_jobs(head))
    finally:
        head.stop()
    with SQLLedger(f"sqlite:///{tmp_path / 'out' / 'ledger.db'}") as ledger:
        rows = ledger.runs_table("ray-cluster")
    assert [row["status"] for row in rows] == ["failed", "failed"], err[-3000:]
    assert all(row["error"].startswith("TimeoutError: the run exceeded executor.run_timeout_s") for row in rows)
    assert {row["job_id"] for row in rows} == set(jobs)  # each run's job, recorded and then stopped
    assert set(jobs.values()) == {"STOPPED"}


@pytest.mark.slow
def test_a_failed_job_keeps_its_log_tail_and_stop_job_stops_a_running_job(short_root: Path, tmp_path: Path):
    head = Head(short_root, dashboard=True)
    try:
        done = subprocess.run([sys.executable, "-c", LIFECYCLE, head.address, str(tmp_path)], env=head.env,
                              capture_output=True, text=True, timeout=600)
    finally:
        head.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    broken_sid = submission_ids(str(tmp_path / "exp" / "broken"))[0] + "-a1"
    sleeper = submission_ids(str(tmp_path / "exp" / "sleeper"))[0]

    failed = report["failed"]  # one line: the ledger keeps an error's first line
    assert "\n" not in failed and len(failed) < 1700
    assert failed.startswith(f"Ray job {broken_sid} ended FAILED; last lines of its log: ")
    assert " | " in failed and failed.endswith("remove it or check its spelling against the documented fields")
    assert "ConfigError: run config: unknown key `no_such_field`" in failed
    address = report["events"][0][2]["address"]
    assert address.startswith("http://127.0.0.1:")
    assert report["failed_again"].startswith(f"Ray job {broken_sid[:-1]}2 ended FAILED")
    assert report["events"] == [["job", 0, {"submission_id": broken_sid, "address": address}],
                                ["job", 0, {"submission_id": f"{broken_sid[:-1]}2", "address": address}],
                                ["job", 0, {"submission_id": f"{sleeper}-a2", "address": address}]]

    assert (report["stopped"], report["status"]) == (True, "STOPPED")
    assert (report["stopped_again"], report["stopped_unknown"]) == (False, False)
    assert report["retried"].startswith(f"Ray job {sleeper}-a2 ended FAILED")
