"""Run one real verl 0.9.1 DAPO job on this CPU machine, bounded, and report what it logged.

    .venv-verl/bin/python tests/verl_cpu/run_job.py --workdir /tmp/verl-cpu-1
    .venv-verl/bin/python tests/verl_cpu/run_job.py --workdir /tmp/verl-cpu-2 --project-loss

Writes the fixtures (tiny Qwen2, parquet, reward) into the work dir, creates an MLflow run in
``<workdir>/mlflow.db``, runs ``python -m verl.trainer.main_ppo`` with ``dapo_overrides`` +
``CPU_OVERRIDES`` + ``local_ray_overrides`` under a hard timeout, cleans up the run's processes and
/dev/shm segments, and writes ``<workdir>/report.json``: exit code, wall time, peak PSS, every
metric name (last value) and param key verl logged to MLflow. Exits with the job's exit code.

The job (V1 trainer, verl's default): 8 prompts x 4 responses a step, 2 steps, responses of at
most 24 tokens with a soft-overlong buffer of 8, Dynamic Sampling on ``acc``, Clip-Higher 0.28,
token-mean loss, validation before training and at the end with n=4.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `verl_cpu` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl_cpu.fixtures import (  # noqa: E402
    CPU_ENV,
    CPU_OVERRIDES,
    local_ray_overrides,
    new_run_marker,
    run_bounded,
    write_dataset,
    write_json,
    write_reward_fn,
    write_tiny_model,
)

ENTRYPOINT = ["-m", "verl.trainer.main_ppo"]
PROJECT_LOSS_MODULE = "dapo_ablate.ablation.runtime.backends.verl_loss"
PROJECT_LOSS = "dapo_overlong_filter"
PROJECT_LOSS_ENV = "DAPO_ABLATE_MAX_RESPONSE_LEN"  # the response ceiling that loss reads (the verl backend sets it)
MAX_RESPONSE_LEN = 24
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


def dapo_overrides(
    model: Path, train: Path, val: Path, reward_path: Path, reward_name: str, *,
    steps: int = 2, prompts: int = 8, group_size: int = 4, max_response_len: int = MAX_RESPONSE_LEN,
    overlong_buffer: int = 8, eval_k: int = 4, loss_mode: str = "vanilla", seed: int = 0,
    project: str = "verl-cpu", run_name: str = "dapo",
) -> list[str]:
    """A small DAPO job: all five techniques on (Overlong Filtering only with the project's loss)."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.max_prompt_length=64",
        f"data.max_response_length={max_response_len}",
        f"data.train_batch_size={prompts}",
        f"data.seed={seed}",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=acc",
        f"{A}.policy_loss.loss_mode={loss_mode}",
        # the project's loss comes with the trainer mode that makes verl count its units (verl_trainer)
        f"trainer.v1.trainer_mode={PROJECT_LOSS if loss_mode == PROJECT_LOSS else 'sync'}",
        f"{A}.loss_agg_mode=token-mean",
        f"{A}.clip_ratio_low=0.2",
        f"{A}.clip_ratio_high=0.28",
        f"{A}.use_kl_loss=false",
        f"{A}.optim.lr=1e-3",
        f"{A}.ppo_mini_batch_size={prompts // 2}",  # two optimizer updates a step
        f"{A}.ppo_micro_batch_size_per_gpu={prompts // 2 * group_size}",  # one micro-batch each
        f"{R}.name=vllm",
        f"{R}.n={group_size}",
        f"{R}.temperature=1.0",
        f"{R}.seed={seed}",
        f"{R}.log_prob_micro_batch_size_per_gpu={prompts * group_size}",
        f"{R}.val_kwargs.n={eval_k}",
        f"{R}.val_kwargs.do_sample=true",
        f"{R}.val_kwargs.temperature=1.0",
        "reward.reward_manager.name=dapo",
        f"reward.custom_reward_function.path={reward_path}",
        f"reward.custom_reward_function.name={reward_name}",
        f"+reward.reward_kwargs.max_resp_len={max_response_len}",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
        f"+reward.reward_kwargs.overlong_buffer_cfg.len={overlong_buffer}",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward.reward_kwargs.overlong_buffer_cfg.log=true",
        "trainer.logger=[console,mlflow]",
        f"trainer.project_name={project}",
        f"trainer.experiment_name={run_name}",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        "trainer.val_before_train=true",
        f"trainer.test_freq={steps}",
        "trainer.save_freq=-1",
    ]


def prepare_workdir(workdir: Path) -> tuple[Path, Path, Path, Path, str, str, str]:
    """The job's inputs written into `workdir` (model, data, reward) and its MLflow run:
    (model, train, val, reward path, reward name, tracking URI, MLflow run id)."""
    workdir.mkdir(parents=True, exist_ok=True)
    model = write_tiny_model(workdir / "model")
    train, val = write_dataset(workdir / "data")
    reward_path, reward_name = write_reward_fn(workdir)
    tracking_uri = f"sqlite:///{workdir / 'mlflow.db'}"
    return model, train, val, reward_path, reward_name, tracking_uri, create_mlflow_run(tracking_uri, "verl-cpu", workdir.name)


def create_mlflow_run(tracking_uri: str, experiment: str, run_name: str) -> str:
    """Create the store (once, before any worker touches it) and a run for verl to log into."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    return client.create_run(experiment_id, run_name=run_name).info.run_id


def mlflow_contents(tracking_uri: str, run_id: str) -> dict:
    """Every metric (its steps and last value) and param key of the run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    metrics = {}
    for name in sorted(run.data.metrics):
        history = client.get_metric_history(run_id, name)
        metrics[name] = {"steps": sorted({m.step for m in history}), "last": run.data.metrics[name]}
    return {"status": run.info.status, "metrics": metrics, "params": dict(sorted(run.data.params.items()))}


def job_env(tracking_uri: str, run_id: str, loss_module: str | None) -> dict[str, str]:
    """This machine's environment + CPU_ENV + MLflow; ``python3`` on PATH is this interpreter."""
    env = {**os.environ, **CPU_ENV, "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_RUN_ID": run_id}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if loss_module:
        env["VERL_USE_EXTERNAL_MODULES"] = loss_module
        env[PROJECT_LOSS_ENV] = str(MAX_RESPONSE_LEN)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="hard limit of the job, seconds")
    parser.add_argument("--project-loss", action="store_true",
                        help=f"register {PROJECT_LOSS} from {PROJECT_LOSS_MODULE} and select it")
    parser.add_argument("--legacy-trainer", action="store_true", help="trainer.use_v1=false")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="more environment for the job")
    parser.add_argument("--keep-ray-dir", action="store_true", help="keep the private Ray temp dir (logs)")
    parser.add_argument("extra", nargs="*", help="more Hydra overrides, applied last")
    args = parser.parse_args(argv)

    workdir = args.workdir.resolve()
    model, train, val, reward_path, reward_name, tracking_uri, run_id = prepare_workdir(workdir)

    marker = new_run_marker()
    ray_dir = Path(f"/tmp/vcr_{marker}")  # short: Ray's socket paths live under it
    loss_mode = PROJECT_LOSS if args.project_loss else "vanilla"
    overrides = (
        dapo_overrides(model, train, val, reward_path, reward_name, steps=args.steps, loss_mode=loss_mode,
                       run_name=workdir.name)
        + (["trainer.use_v1=false"] if args.legacy_trainer else [])
        + CPU_OVERRIDES + local_ray_overrides(ray_dir) + args.extra
    )
    env = job_env(tracking_uri, run_id, PROJECT_LOSS_MODULE if args.project_loss else None)
    env.update(item.split("=", 1) for item in args.env)
    command = [sys.executable, *ENTRYPOINT, *overrides]
    (workdir / "command.txt").write_text("\n".join(command) + "\n")

    result = run_bounded(command, env, workdir / "job.log", args.timeout, marker=marker, temp_dir=ray_dir,
                         cwd=workdir)
    report = {"job": result.summary(), "overrides": overrides, "mlflow": mlflow_contents(tracking_uri, run_id)}
    write_json(workdir / "report.json", report)
    if ray_dir.exists() and not args.keep_ray_dir and result.returncode == 0:
        shutil.rmtree(ray_dir, ignore_errors=True)
    print({k: v for k, v in report["job"].items()}, f"{len(report['mlflow']['metrics'])} metrics", sep="\n")
    return 124 if result.timed_out else result.returncode


if __name__ == "__main__":
    sys.exit(main())
