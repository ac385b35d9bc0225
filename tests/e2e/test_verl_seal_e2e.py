"""A verl run resumes only from checkpoints its own jobs wrote, through `dapo-ablate run --address`
on a Ray cluster with a fake GPU (ray.cluster_utils, the Job API): the product submits each cell's
job, watches it, and resubmits it when it is lost. verl needs GPUs, so the job's
``verl.trainer.main_ppo`` is a stand-in (on the node's PYTHONPATH, with verl 0.9.1's distribution
metadata) that does what verl does with checkpoints: with ``trainer.resume_mode=auto`` it resumes
from the step ``latest_checkpointed_iteration.txt`` in ``trainer.default_local_dir`` names when
that folder exists (else from step 0), saves ``global_step_<n>`` every ``save_freq`` steps and
then the tracker, and logs verl's metrics into the cell's MLflow run. Its first job of each run is
lost after its step-2 save (it ends itself with SIGTERM, as a preempted node's job does), so the
driver resubmits it. Everything else is the product.

- A checkpoint planted in a run's folder before its first job is set aside (moved, not deleted)
  with one note, and the job starts from step 0 with validation before training.
- The checkpoint the run's own lost job wrote is resumed by the resubmitted job, which skips
  validation before training.

The same rules on folders alone (edits, links, another run's tracker, pruning): tests/unit/test_verl_seal.py.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.ledger import SQLLedger

from support import pythonpath_with_tests
from test_ray_cluster import dapo_ablate_run, short_root  # noqa: F401 - fixture
from test_verl_job_shape import GpuCluster, fake_verl
from test_verl_preflight import model_folder, write_parquet

pytestmark = pytest.mark.slow

MAIN_PPO = textwrap.dedent('''
    """Stand-in for verl's main_ppo: verl 0.9.1's checkpoints and resume_mode=auto (see the test)."""
    import json, os, signal, sys
    from pathlib import Path

    import mlflow

    overrides = dict(arg.lstrip("+").split("=", 1) for arg in sys.argv[1:])  # the last value of a key wins, as in Hydra
    folder = Path(overrides["trainer.default_local_dir"])
    run_folder, tracker = folder.parent, folder / "latest_checkpointed_iteration.txt"
    total, every = int(overrides["trainer.total_training_steps"]), int(overrides["trainer.save_freq"])
    k = int(overrides["actor_rollout_ref.rollout.val_kwargs.n"])
    start, weights = 0, None
    if overrides["trainer.resume_mode"] == "auto" and tracker.is_file():
        named = folder / f"global_step_{int(tracker.read_text())}"
        if named.is_dir():  # else verl says "checkpoint does not exist" and trains from scratch
            start = int(tracker.read_text())
            weights = (named / "actor" / "model_world_size_1_rank_0.pt").read_text()
    record = {"start": start, "weights": weights, "val_before_train": overrides["trainer.val_before_train"],
              "found": sorted(os.listdir(folder)) if folder.is_dir() else []}
    with open(run_folder / "attempts.jsonl", "a") as out:
        out.write(json.dumps(record) + "\\n")
    validation = f"val-core/aime/acc/mean_at_{k}"
    with mlflow.start_run():  # MLFLOW_RUN_ID: the cell's child run
        if overrides["trainer.val_before_train"] == "true":
            mlflow.log_metric(validation, 0.25, step=start)
        for step in range(start + 1, total + 1):
            mlflow.log_metric("response_length/mean", 10.0, step=step)
            if step % every == 0 or step == total:
                (folder / f"global_step_{step}" / "actor").mkdir(parents=True, exist_ok=True)
                (folder / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(f"weights {step}".encode())
                (folder / f"global_step_{step}" / "data.pt").write_bytes(b"dataloader state")
                tracker.write_text(str(step))
            if step == 2 and not (run_folder / "lost-once").exists():
                (run_folder / "lost-once").write_text("")
                os.kill(os.getpid(), signal.SIGTERM)  # a preempted node: the driver resubmits the job
        mlflow.log_metric(validation, 0.5, step=total)
''')


def checkpointing_verl(site: Path) -> None:
    fake_verl(site)
    (site / "verl" / "trainer" / "main_ppo.py").write_text(MAIN_PPO)


def seal_spec(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "out"
    trainer = {
        "backend": "verl", "model": {"path": str(model_folder(folder / "models" / "Qwen2.5-0.5B"))},
        "data": {"train": str(write_parquet(folder / "dapo-math-17k.parquet", ["1+1", "2+2", "3+3", "4+4"])),
                 "eval": str(write_parquet(folder / "aime-2024.parquet", ["1+2"]))},
        "rollout": {"engine": "vllm", "max_response_len": 64, "eval_k": 4},
        "algorithm": {"group_size": 4, "overlong_cache": 16},
        "batch": {"prompts_per_step": 4, "mini_batch_size": 16},
        "schedule": {"total_steps": 4, "eval_every": 4, "checkpoint_every": 2},
    }
    spec = {
        "name": "seal", "trainer": trainer, "factors": ["overlong_filter"], "seeds": 1, "metric": "avg@4",
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
        "executor": {"gpus_per_run": 1, "gpus_per_node": 1, "cpus_per_run": 0, "max_concurrent": 1,
                     "retries": 1, "run_timeout_s": 1800},  # a bound for a broken build only
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def attempts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]


def test_a_planted_checkpoint_is_set_aside_and_a_lost_job_resumes_from_its_own(short_root: Path, tmp_path: Path):
    site = tmp_path / "site"
    checkpointing_verl(site)
    spec = seal_spec(tmp_path / "exp")
    planted, other = (run.run_id for run in expand(load_spec(spec)).runs)
    runs = tmp_path / "exp" / "out" / "seal"
    hand_made = runs / planted / "checkpoints" / "global_step_3"
    (hand_made / "actor").mkdir(parents=True)
    (hand_made / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"weights another run trained")
    (hand_made.parent / "latest_checkpointed_iteration.txt").write_text("3")
    cluster = GpuCluster(short_root, nodes=1, gpus=1, python_path=pythonpath_with_tests(str(site)))
    try:
        result = dapo_ablate_run(spec, "--address", cluster.address, env=cluster.env, timeout=1800)
    finally:
        cluster.shutdown()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with SQLLedger(f"sqlite:///{tmp_path / 'exp' / 'out' / 'ledger.db'}") as ledger:
        rows = {row["run_id"]: row for row in ledger.runs_table("seal")}
    assert all(row["status"] == "done" and row["attempts"] == 2 for row in rows.values()), rows

    # the planted checkpoint: set aside before the first job, which started from step 0 and validated
    notes = [line for line in result.stdout.splitlines() if "did not write" in line]
    assert len(notes) == 1 and "global_step_3: not sealed for this run" in notes[0], result.stdout[-3000:]
    [aside] = list((runs / planted).glob("checkpoints.set-aside-*"))
    assert (aside / "global_step_3" / "actor" / "model_world_size_1_rank_0.pt").read_bytes() == b"weights another run trained"
    assert (aside / "latest_checkpointed_iteration.txt").read_text() == "3"
    # each run's lost job saved step 2; its resubmission resumed there, without validation before training
    for run_id in (planted, other):
        first, resumed = attempts(runs / run_id)
        assert first == {"start": 0, "weights": None, "val_before_train": "true", "found": []}
        assert resumed == {"start": 2, "weights": "weights 2", "val_before_train": "false",
                           "found": ["global_step_2", "latest_checkpointed_iteration.txt"]}
        seal = json.loads((runs / run_id / "checkpoints-seal.json").read_text())
        assert sorted(seal["steps"]) == ["2", "4"] and seal["tracker"]["step"] == 4  # sealed when the last job ended
    assert not list((runs / other).glob("checkpoints.set-aside-*"))
