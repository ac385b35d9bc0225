"""Real verl 0.9.1 DAPO jobs, one per cell, two AT ONCE on one Ray cluster, driven by ``dapo-ablate
run`` through Ray's Job API on this CPU machine, read back into the ledger and MLflow, then
``dapo-ablate report``.

The cluster is a ``ray start --head`` with two fake GPUs (verl's resource pool asks Ray for GPUs;
tests/verl_cpu/cluster.py starts it and writes the spec) whose environment carries the CPU
platform's variables (``verl_cpu.fixtures.CPU_ENV``: the plugin of tests/verl_cpu, installed in the
verl environment by tests/verl_cpu/install.sh) and puts this environment's ``python3`` first on
PATH, as a cluster image would. The spec's one factor is Dynamic Sampling (off / on: 2 runs, with
``executor.max_concurrent: 2``); the base trainer has Overlong Filtering and the Soft Overlong
Punishment on (their effects show in verl's metrics) and Clip-Higher and Token-Level Loss off. Each
job trains a 105k-parameter random Qwen2 made here for 2 steps (8 prompts x 4 responses, responses
of at most 24 tokens, so many are cut at the ceiling) with a reward a random policy varies
(tests/verl_cpu/char_reward.py). The CPU overrides reach every job through ``trainer.verl.overrides``,
the product's own escape hatch.

The two jobs are isolated (``backends/verl_isolation.py``): they ran at the same time (each started
before the other ended, in Ray's job records), each started its own TransferQueue controller, in Ray's
actor list in the namespace of its own Ray job (``transfer_queue-<job id>``) and started by that job,
none in TransferQueue's shared namespace ``transfer_queue``; both SUCCEEDED and each run's own result
was read back.

Each technique is seen in verl's own logged metrics and config, per job, for the state it has there:

- Dynamic Sampling: ``training/filter_groups/evicted_samples`` only in DS-on jobs;
- Overlong Filtering: our loss's ``actor/overlong_filtered_frac`` only in OF-on jobs, above 0 in a
  step exactly when verl's own ``response_length/clip_ratio`` is (responses really at the ceiling);
- Soft Overlong Punishment: the dapo reward manager's ``val-aux/<source>/overlong_reward`` only in
  SP-on jobs, and a training score below -1 (wrong and penalised) only there;
- Clip-Higher and Token-Level Loss: verl's logged config (``actor_rollout_ref/actor/clip_ratio_high``,
  ``.../loss_agg_mode``), and the V1 trainer in every job.

What each technique changes in verl's computation is tested on verl's own code in
tests/e2e/test_verl_techniques.py. Every job runs under ``executor.run_timeout_s`` and the whole test
under a hard bound; the head and everything the jobs started (TaskRunner processes that outlive their
driver, shared-memory segments) are removed by the run marker afterwards (verl_cpu.fixtures.RunWatch).
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
RUN_TIMEOUT_S = 1800  # one job: ~1.5 min on an idle machine, ~3.5 min at load 10 (tests/verl_cpu/README.md); two at once share the cores
KV_CACHE = "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=64M"
"""Each job's vLLM KV cache: 64 MiB, not the 1 GiB of ``VLLM_CPU_KVCACHE_SPACE=1`` (which would win:
it is left out of the head's environment), so two jobs fit this machine's memory beside other work."""
TECHNIQUES = {"overlong_filter": True, "soft_overlong": True, "clip_higher": False, "token_level_loss": False}
"""The base trainer's four other techniques (Dynamic Sampling is the factor)."""
JOBS_AND_ACTORS = """
import json, sys
from ray.job_submission import JobSubmissionClient
from ray.util.state import list_actors
jobs = {j.submission_id: {"entrypoint": j.entrypoint, "status": str(j.status), "job_id": j.job_id,
                          "start": j.start_time, "end": j.end_time}
        for j in JobSubmissionClient(sys.argv[1]).list_jobs() if j.submission_id}
actors = [{"class_name": a.class_name, "ray_namespace": a.ray_namespace, "job_id": a.job_id, "state": a.state}
          for a in list_actors(address=sys.argv[1], filters=[("class_name", "=", "TransferQueueController")], limit=1000)]
print(json.dumps({"jobs": jobs, "actors": actors}))
"""
"""Ray's records of the cluster's jobs and TransferQueue controllers (alive or dead), as JSON."""


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


def test_two_real_verl_jobs_at_once_on_one_ray_each_with_its_own_transfer_queue_and_techniques_in_verls_metrics(tmp_path: Path):
    require_verl()
    from verl_cpu.cluster import SOURCE, start_head, verl_spec

    from dapo_ablate.ablation.runtime.backends.verl_isolation import NAMESPACE, controllers, job_namespace
    from verl_cpu.fixtures import CPU_ENV, RUN_MARKER_VAR, RunWatch, new_run_marker

    marker = new_run_marker()
    root = Path(f"/tmp/vct_{marker}")  # short: Ray's socket paths live under it
    root.mkdir()
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, **CPU_ENV, RUN_MARKER_VAR: marker, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "VLLM_CPU_KVCACHE_SPACE"):
        env.pop(key, None)
    watch = RunWatch(marker, str(root))
    try:
        with watch:
            address, job_api = start_head(root, env, gpus=2)
            spec = verl_spec(tmp_path, address, settings=False, techniques=TECHNIQUES, max_concurrent=2,
                             run_timeout_s=RUN_TIMEOUT_S, extra=[KV_CACHE])
            dry = subprocess.run([str(BIN / "dapo-ablate"), "run", str(spec), "--dry-run"], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=600)
            assert dry.returncode == 0, dry.stderr[-3000:]
            printed = re.findall(r"^  \[(.+?)\] (.*)$", dry.stdout, flags=re.M)
            assert len(printed) == 2

            run = subprocess.run([str(BIN / "dapo-ablate"), "run", str(spec), "--no-progress"], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=2 * RUN_TIMEOUT_S + 600)
            (tmp_path / "run.log").write_text(run.stdout + run.stderr)
            assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]

            listing = subprocess.run([sys.executable, "-c", JOBS_AND_ACTORS, job_api], env=env, capture_output=True,
                                     text=True, timeout=HANG_GUARD_S)
            assert listing.returncode == 0, listing.stderr[-2000:]
            found = json.loads(listing.stdout.strip().splitlines()[-1])
    finally:
        leftovers = watch.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    print(f"cleanup: {leftovers}; peak PSS {watch.peak_pss_bytes / 2**30:.1f} GiB")
    jobs, actors = found["jobs"], found["actors"]

    # two jobs, each exactly the entrypoint the dry run printed, each SUCCEEDED, at the same time
    assert len(jobs) == 2 and all(job["status"].endswith("SUCCEEDED") for job in jobs.values()), jobs
    assert sorted(job["entrypoint"] for job in jobs.values()) == sorted(entry for _, entry in printed)
    assert max(job["start"] for job in jobs.values()) < min(job["end"] for job in jobs.values()), jobs
    # one ended first while the other was still running, and the other still SUCCEEDED: the first job's
    # end (its driver, and the controller it owns, gone) did not take the other's TransferQueue with it
    first, last = sorted(jobs.values(), key=lambda job: job["end"])
    assert first["end"] < last["end"] and last["status"].endswith("SUCCEEDED"), jobs
    # each job started its own TransferQueue controller, in its own namespace; none in TransferQueue's shared one
    job_ids = sorted(job["job_id"] for job in jobs.values())
    assert len(actors) == 2 and controllers(actors) == {job_namespace(job_id): job_id for job_id in job_ids}, actors
    assert NAMESPACE not in controllers(actors)

    # the ledger: two runs done, each with its own verl avg@4 read back
    from dapo_ablate.ablation.store.ledger import SQLLedger

    out = tmp_path / "out"
    with SQLLedger(f"sqlite:///{out}/ledger.db") as ledger:
        rows = ledger.runs_table("verl-cpu")
        results = ledger.results("verl-cpu")
    assert len(rows) == 2 and all(row["status"] == "done" and row["job_id"] for row in rows)
    assert sorted(row["job_id"] for row in rows) == sorted(jobs), (rows, jobs)
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
    assert (tmp_path / "report" / "report.md").is_file()
