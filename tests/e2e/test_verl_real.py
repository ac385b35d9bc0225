"""Real verl 0.9.1 DAPO jobs, one per cell, driven by ``dapo-ablate run`` through Ray's Job API on
this CPU machine, read back into the ledger and MLflow, then ``dapo-ablate report``.

The cluster is a ``ray start --head`` with one fake GPU (verl's resource pool asks Ray for GPUs;
tests/verl_cpu/cluster.py starts it and writes the spec)
whose environment carries the CPU platform's variables (``verl_cpu.fixtures.CPU_ENV``: the plugin
of tests/verl_cpu, installed in the verl environment by tests/verl_cpu/install.sh) and puts this
environment's ``python3`` first on PATH, as a cluster image would. The spec is a transfer study of
4 runs: Dynamic Sampling off / on in two settings, ``grpo`` (the four other techniques off) and
``dapo`` (on), so every technique is off in two jobs and on in two. Each job trains a 105k-parameter
random Qwen2 made here for 2 steps (8 prompts x 4 responses, responses of at most 24 tokens, so
many are cut at the ceiling) with a reward a random policy varies (tests/verl_cpu/char_reward.py).
The CPU overrides reach every job through ``trainer.verl.overrides``, the product's own escape hatch.

Each technique is seen taking effect in verl's own logged metrics and config, per job:

- Dynamic Sampling: ``training/filter_groups/evicted_samples`` only in DS-on jobs;
- Overlong Filtering: our loss's ``actor/overlong_filtered_frac`` only in OF-on jobs, above 0 in a
  step exactly when verl's own ``response_length/clip_ratio`` is (responses really at the ceiling);
- Soft Overlong Punishment: the dapo reward manager's ``val-aux/<source>/overlong_reward`` only in
  SP-on jobs, and a training score below -1 (wrong and penalised) only there;
- Clip-Higher and Token-Level Loss: verl's logged config (``actor_rollout_ref/actor/clip_ratio_high``,
  ``.../loss_agg_mode``), and the V1 trainer in every job.

Every job runs under ``executor.run_timeout_s`` and the whole test under a hard bound; the head and
everything the jobs started (TaskRunner processes that outlive their driver, shared-memory
segments) are removed by the run marker afterwards (verl_cpu.fixtures.RunWatch).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verl_env import require_verl
from support import HANG_GUARD_S


pytestmark = [pytest.mark.verl, pytest.mark.slow]

BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 1500  # one job: ~1.5 min on an idle machine, ~3.5 min at load 10 (tests/verl_cpu/README.md)


def mlflow_runs(uri: str, experiment: str) -> dict[str, dict]:
    """Child runs by our run id: status, verl's params and metric histories."""
    from mlflow import MlflowClient

    from dapo_ablate.ablation.store.tracking import RUN_ID_TAG

    client = MlflowClient(uri)
    found = {}
    for run in client.search_runs([client.get_experiment_by_name(experiment).experiment_id]):
        if RUN_ID_TAG not in run.data.tags:
            continue
        history = {name: {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)} for name in run.data.metrics}
        found[run.data.tags[RUN_ID_TAG]] = {"status": run.info.status, "params": run.data.params, "history": history}
    return found


def test_real_verl_jobs_per_cell_through_the_job_api_with_each_technique_visible_in_verls_metrics(tmp_path: Path):
    require_verl()
    from verl_cpu.cluster import SOURCE, start_head, verl_spec
    from verl_cpu.fixtures import CPU_ENV, RUN_MARKER_VAR, RunWatch, new_run_marker

    marker = new_run_marker()
    root = Path(f"/tmp/vct_{marker}")  # short: Ray's socket paths live under it
    root.mkdir()
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, **CPU_ENV, RUN_MARKER_VAR: marker, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN", None)
    watch = RunWatch(marker, str(root))
    try:
        with watch:
            address, job_api = start_head(root, env)
            spec = verl_spec(tmp_path, address, run_timeout_s=RUN_TIMEOUT_S)
            dry = subprocess.run([str(BIN / "dapo-ablate"), "run", str(spec), "--dry-run"], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=600)
            assert dry.returncode == 0, dry.stderr[-3000:]
            printed = re.findall(r"^  \[(.+?)\] (.*)$", dry.stdout, flags=re.M)
            assert len(printed) == 4

            run = subprocess.run([str(BIN / "dapo-ablate"), "run", str(spec), "--no-progress"], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=4 * RUN_TIMEOUT_S + 600)
            (tmp_path / "run.log").write_text(run.stdout + run.stderr)
            assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]

            listing = subprocess.run(
                [sys.executable, "-c", "import json, sys; from ray.job_submission import JobSubmissionClient; "
                 "print(json.dumps({j.submission_id: [j.entrypoint, str(j.status)] for j in "
                 "JobSubmissionClient(sys.argv[1]).list_jobs() if j.submission_id}))", job_api],
                env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
            assert listing.returncode == 0, listing.stderr[-2000:]
            jobs = json.loads(listing.stdout.strip().splitlines()[-1])
    finally:
        leftovers = watch.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    print(f"cleanup: {leftovers}")

    # four jobs, each exactly the entrypoint the dry run printed, each SUCCEEDED
    assert len(jobs) == 4 and all(status.endswith("SUCCEEDED") for _, status in jobs.values()), jobs
    assert sorted(entrypoint for entrypoint, _ in jobs.values()) == sorted(entry for _, entry in printed)

    # the ledger: four runs done, with verl's avg@4 read back
    from dapo_ablate.ablation.store.ledger import SQLLedger

    out = tmp_path / "out"
    with SQLLedger(f"sqlite:///{out}/ledger.db") as ledger:
        rows = ledger.runs_table("verl-cpu")
        results = ledger.results("verl-cpu")
    assert len(rows) == 4 and all(row["status"] == "done" and row["job_id"] for row in rows)
    assert all(0.0 <= r["metrics"]["avg@4"] <= 1.0 and r["metrics"]["steps"] == 2 for r in results)

    # MLflow: one child per run, verl's own metrics in it, FINISHED
    runs = mlflow_runs(f"sqlite:///{out}/mlflow.db", "verl-cpu")
    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import load_spec

    planned = {run.run_id: run.config.techniques for run in expand(load_spec(tmp_path / "spec.yaml")).runs}
    assert sorted(runs) == sorted(planned)
    for run_id, run in runs.items():
        t, params, history = planned[run_id], runs[run_id]["params"], runs[run_id]["history"]
        assert run["status"] == "FINISHED" and params["trainer/use_v1"] == "True"
        # Clip-Higher and Token-Level Loss: in the config verl ran with
        assert params["actor_rollout_ref/actor/clip_ratio_high"] == ("0.28" if t.clip_higher else "0.2")
        assert params["actor_rollout_ref/actor/loss_agg_mode"] == ("token-mean" if t.token_level_loss else "seq-mean-token-mean")
        # Dynamic Sampling: verl's replay buffer evicts all-same groups only when it is on
        evicted = history.get("training/filter_groups/evicted_samples", {})
        assert bool(evicted) is t.dynamic_sampling, (run_id, evicted)
        # Overlong Filtering: our loss's metric, non-zero exactly at the steps where responses hit the ceiling
        filtered = history.get("actor/overlong_filtered_frac", {})
        clipped = history["response_length/clip_ratio"]
        if t.overlong_filter:
            assert filtered and all((filtered[step] > 0) == (clipped[step] > 0) for step in filtered), (filtered, clipped)
        else:
            assert not filtered
        # Soft Overlong Punishment: the reward manager's penalty, only with it on
        overlong = [key for key in history if key.startswith(f"val-aux/{SOURCE}/overlong_reward/")]
        assert bool(overlong) is t.soft_overlong, (run_id, overlong)
        lowest = min(history["critic/score/min"].values())
        assert lowest >= -1.0 or t.soft_overlong, (run_id, lowest)  # below -1: wrong and penalised for length
        # verl's avg@4 at steps 0 and 2, as read back into the ledger
        assert sorted(history[f"val-core/{SOURCE}/acc/mean_at_4"]) == [0, 2]
    assert any(min(r["history"]["critic/score/min"].values()) < -1.0 for r in runs.values())  # the penalty bit

    # the report runs on what the jobs produced
    report = subprocess.run([str(BIN / "dapo-ablate"), "report", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "report")],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (tmp_path / "report" / "report.md").is_file() and (tmp_path / "report" / "transfer.csv").is_file()
