"""A cell as a Ray job on a real local cluster (``ray start --head`` with the dashboard's Job API
and token authentication): the job path runs cells whose entrypoint is the built-in trainer; the
driver is SIGKILLed while a job runs, and the rerun re-attaches to it instead of submitting it
again, recording each cell once in the ledger and once in MLflow. No mock of Ray or MLflow.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_jobs_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_ablate.ablation.runtime.backends.verl_results import result_from_history, score_name
from dapo_ablate.ablation.runtime.jobs import RESULT_MARKER, JobFailed, result_from_logs, submission_ids

from test_ray_cluster import Head, client_env, short_root  # noqa: F401 - fixture
from support import ROOT


def test_a_failure_message_is_one_ledger_line_ending_with_the_log_tail():
    from dapo_ablate.ablation.runtime.task import describe_error
    from dapo_ablate.ablation.runtime.joblog import LOG_TAIL_CHARS, LOG_TAIL_LINES, log_tail

    logs = "\n".join(f"line {i}" for i in range(100)) + "\n\nTraceback (most recent call last):\n  boom\nValueError: bad lr\n\n"
    tail = log_tail(logs)
    assert tail.endswith("line 97 | line 98 | line 99 | Traceback (most recent call last): | boom | ValueError: bad lr")
    assert tail.count(" | ") == LOG_TAIL_LINES - 1
    error = describe_error(JobFailed(f"Ray job sid ended FAILED; last lines of its log: {tail}"))
    assert error == f"JobFailed: Ray job sid ended FAILED; last lines of its log: {tail}"  # kept whole by the ledger

    long = log_tail("\n".join("x" * 400 + f" {i}" for i in range(20)) + "\nValueError: bad lr")
    assert len(long) == LOG_TAIL_CHARS and long.startswith("...") and long.endswith(" | ValueError: bad lr")


def test_submission_ids_and_result_lines():
    prefix, record = submission_ids("/runs/out/my-exp/0123abcd")
    assert prefix == "dapo-ablate-my-exp-0123abcd" and record == Path("/runs/out/my-exp/0123abcd/job.json")
    result = {"metrics": {"avg@32": 0.5}, "eval_curve": [], "signals": [], "wall_s": 1.0}
    assert result_from_logs(f"training...\n{RESULT_MARKER}{json.dumps(result)}\n", "sid") == result
    with pytest.raises(JobFailed, match=r"printed no result line \(DAPO_ABLATE_RESULT\); last lines of its log: Traceback \| boom$"):
        result_from_logs("Traceback\nboom\n", "sid")


def test_verl_metrics_read_back_into_the_ledger_shape():
    assert score_name("val-core/math_dapo/acc/mean_at_32") == "avg@32"
    assert score_name("val-core/aime/acc/best@32/mean") == "pass@32"
    assert score_name("val-core/aime/acc/maj_at_32/mean") == "maj@32"
    assert score_name("critic/score/mean") is None
    history = {
        "val-core/aime/acc/mean_at_32": [(0, 0.1), (5, 0.3)],
        "val-core/aime/acc/best_at_32/mean": [(0, 0.4), (5, 0.6)],
        "critic/score/mean": [(1, -0.5), (2, -0.2)],
        "response_length/clip_ratio": [(1, 0.1)],
    }
    result = result_from_history(history, wall_s=12.0)
    assert result["metrics"] == {"avg@32": 0.3, "pass@32": 0.6, "steps": 5}
    assert result["eval_curve"] == [{"step": 0, "avg@32": 0.1, "pass@32": 0.4}, {"step": 5, "avg@32": 0.3, "pass@32": 0.6}]
    assert result["signals"] == [{"step": 1, "reward": -0.5, "truncation_rate": 0.1}, {"step": 2, "reward": -0.2}]


def test_a_verl_cell_goes_to_the_job_path_not_the_builtin_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from dapo_ablate.ablation.runtime.cell import run_cell
    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import load_spec

    config = expand(load_spec(ROOT / "examples" / "paper_verl.yaml")).runs[0].config
    monkeypatch.setenv("DAPO_ABLATE_JOBS_ADDRESS", "http://127.0.0.1:1")  # no Job API there
    with pytest.raises(ConnectionError, match="127.0.0.1:1"):
        run_cell(config.to_dict(), str(tmp_path / "exp" / "run"), None)


def test_a_resumed_runs_wall_time_adds_up_the_jobs_of_all_its_attempts():
    from types import SimpleNamespace

    from dapo_ablate.ablation.runtime.jobs import attempts_wall_s

    class JobApi:
        """Ray's Job API as `attempts_wall_s` reads it: JobInfo times in ms; an unknown id is a 404."""

        jobs = {"p-a1": SimpleNamespace(start_time=1_000, end_time=3_601_000),  # stopped at the deadline: 1 h
                "p-a2": SimpleNamespace(start_time=4_000_000, end_time=None),  # never started its entrypoint
                "p-a3": SimpleNamespace(start_time=5_000_000, end_time=5_000_000 + 1_800_000)}  # resumed: 0.5 h

        def get_job_info(self, sid):
            if sid not in self.jobs:
                raise RuntimeError(f"Job {sid} does not exist")
            return self.jobs[sid]

    assert attempts_wall_s(JobApi(), "p", 3) == 3600.0 + 1800.0  # not the last attempt's 1800 s alone
    assert attempts_wall_s(JobApi(), "p", 4) == 5400.0  # a4 unknown to Ray: nothing added
    assert attempts_wall_s(JobApi(), "q", 2) is None  # no job known: the read-back uses the run's own span


def test_a_verl_retry_that_resumes_from_a_checkpoint_skips_validation_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The job submitted for a verl run: as the dry run printed it (validation before training on)
    while the run has no checkpoint; with one (verl's tracker file in the run's checkpoints/), the
    same entrypoint with ``trainer.val_before_train=false`` last (Hydra keeps the last value)."""
    import shlex

    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import load_spec
    from dapo_ablate.ablation.runtime.backends.verl_job import JOB_ENV, verl_job
    from dapo_ablate.ablation.runtime.jobs import MLFLOW_RUN_ENV, _submit

    spec = load_spec(ROOT / "examples" / "paper_verl.yaml")
    run = expand(spec).runs[0]
    job = verl_job(spec, run, ship=False)
    monkeypatch.setenv(JOB_ENV, job.to_json())
    monkeypatch.setenv(MLFLOW_RUN_ENV, "mlflow-child")

    class JobApi:
        submitted: list[str] = []

        def submit_job(self, entrypoint, **_):
            self.submitted.append(entrypoint)

    run_dir = tmp_path / "exp" / run.run_id
    _submit(JobApi(), "a1", run.config.to_dict(), str(run_dir), None)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("300")
    _submit(JobApi(), "a2", run.config.to_dict(), str(run_dir), None)
    first, resumed = JobApi.submitted
    assert first == job.entrypoint and "trainer.val_before_train=true" in shlex.split(first)
    assert resumed == f"{job.entrypoint} trainer.val_before_train=false"
