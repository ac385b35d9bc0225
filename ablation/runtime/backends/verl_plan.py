"""What ``validate`` / ``run --dry-run`` print for a verl experiment: every cell's Ray job (the
entrypoint exactly as submitted, its environment, nodes and GPUs) and a GPU-hour estimate.

The estimate is a FLOP count, not a measurement (no GPU here): per rollout step,

- generation: 2 N FLOPs per generated token at `GENERATION_MFU` of the GPU's bf16 peak (decoding is
  memory-bound), for the prompts verl's V1 trainer generates x group_size responses: without
  Dynamic Sampling prompts_per_step; with it `v1_prompts_per_step` (what V1's replay buffer
  dispatches, in expectation, when a share `EVICTED_SHARE` of groups is all correct or all wrong:
  assumed, not known before a run);
- training: 8 N FLOPs per trained token (6 N forward-backward + 2 N for the old log-probs) at
  `TRAINING_MFU`, for prompts_per_step x group_size responses of `PROMPT_TOKENS` + their length;
- evaluation: 2 N per token at `GENERATION_MFU`, eval_k samples of every row of the evaluation
  parquet (verl validates each row n times: ``verl_data``) at the start, every eval_every steps and
  after the last (`ScheduleConfig.evaluations`); the rows are read from the file where this machine
  sees it, else `EVAL_PROBLEMS` (AIME 2024's 30) are assumed and the plan says so;

with N parsed from the model path (``...-32B`` -> 32e9) and every response assumed to run to
`MEAN_RESPONSE_SHARE` of max_response_len. Real runs vary by 2x either way; measure one cell.

Time limit: a verl cell runs under ``executor.run_timeout_s`` when the spec sets it; else under
`TIME_SAFETY` x its estimated wall time (its GPU-hours over its GPUs) + `STARTUP_S` (`time_limit`),
so a 1.5B cell is not held for 72 h nor a 32B one killed at 72 h; without a model size (no
estimate) under run_timeout_s's default. A job past it is stopped and resubmitted from its last
checkpoint (``executor.retries``).

Checkpoint disk: each save holds the actor's fp32 weights and AdamW's two fp32 moments,
`CHECKPOINT_BYTES_PER_PARAM` x N bytes (about 384 GB for 32B); a run keeps at most
``trainer.verl.max_checkpoints`` while it trains (2 for a moment when that is 1: verl removes the old
one after the new one is saved) and what ``executor.checkpoints_when_done`` says once it is done.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from dapo_ablate.ablation.runtime.backends.verl import DEFAULT_MAX_GEN_ROUNDS, job_shape, max_inflight_gen_batches
from dapo_ablate.ablation.runtime.backends.verl_checkpoints import own_checkpoint_dir
from dapo_ablate.ablation.runtime.backends.verl_cluster import jobs_at_once, shared_tracking_problem
from dapo_ablate.ablation.runtime.backends.verl_data import EvalSet, eval_set
from dapo_ablate.ablation.runtime.backends.verl_job import VerlJob, verl_job
from dapo_ablate.ablation.runtime.time_limit import RUN_TIMEOUT_S, TimeLimit
from dapo_ablate.core.config import TrainerConfig

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import PlannedRun
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec

PEAK_FLOPS = 989e12  # H100 SXM dense bf16
GENERATION_MFU = 0.05
TRAINING_MFU = 0.35
MEAN_RESPONSE_SHARE = 0.5
EVICTED_SHARE = 0.5
"""Dynamic Sampling: share of groups assumed all correct or all wrong (evicted) in the estimate."""
PROMPT_TOKENS = 256
CHECKPOINT_BYTES_PER_PARAM = 12
"""fp32 weights (4) + AdamW's first and second moments (4 + 4)."""
EVAL_PROBLEMS = 30
"""Rows of the evaluation set assumed where its file is not on this machine (AIME 2024, once each)."""
TIME_SAFETY = 3.0
"""A verl cell's time limit over its estimated wall time: the estimate is off by up to 2x either way."""
STARTUP_S = 3600.0
"""Added to a verl cell's time limit: Ray workers, loading the model into FSDP and vLLM, resuming a checkpoint."""


def model_params(path: str) -> float | None:
    """Parameters from a model name such as Qwen2.5-32B or Qwen2.5-Math-1.5B-Instruct; None if absent."""
    match = re.search(r"(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])", path.rsplit("/", 1)[-1])
    return float(match.group(1)) * 1e9 if match else None


def gpu_hours(config: TrainerConfig, eval_rows: int | None = None) -> float | None:
    """Estimated GPU-hours of one run (see the module docstring); None without a model size.
    `eval_rows`: rows of the evaluation parquet (None: `EVAL_PROBLEMS`)."""
    n = model_params(config.model.path)
    if n is None:
        return None
    algo, batch, s = config.algorithm, config.batch, config.schedule
    length = MEAN_RESPONSE_SHARE * config.rollout.max_response_len
    generated = generated_prompts(config) * algo.group_size * length
    trained = batch.prompts_per_step * algo.group_size * (PROMPT_TOKENS + length) * batch.epochs
    evaluations = s.evaluations
    evaluated = evaluations * (eval_rows or EVAL_PROBLEMS) * config.rollout.eval_k * length
    seconds = (2 * n * (generated * s.total_steps + evaluated) / (PEAK_FLOPS * GENERATION_MFU)
               + 8 * n * trained * s.total_steps / (PEAK_FLOPS * TRAINING_MFU))
    return seconds / 3600


def v1_prompts_per_step(prompts: int, drop_share: float, max_inflight: int) -> float:
    """Prompts verl 0.9.1's V1 trainer generates in one step with Dynamic Sampling (sync mode,
    ``trainer/ppo/v1/replay_buffer.py``), in expectation, when a share `drop_share` of groups is evicted.

    V1 dispatches the step's `prompts`, then 2 new prompts per evicted group while at most
    `max_inflight` x `prompts` are pending or running; once `prompts` groups are kept it stops
    dispatching, waits for every prompt in flight to finish, and discards the surplus. Kept groups
    reach `prompts` after prompts / (1 - d) finished ones; by then the dispatched ones number
    prompts + 2 d x that, so prompts x d / (1 - d) are still in flight (at most the bound), all
    generated: prompts / (1 - d) + min(max_inflight x prompts, prompts x d / (1 - d)).
    Examples at 512 prompts and a bound of 3: d 0.1 -> 626, 0.5 -> 1,536, 0.8 -> 4,096
    (the recipe's rounds of 1,536: 1,536, 1,536, 3,072)."""
    if not 0 <= drop_share < 1:
        raise ValueError(f"drop_share must be in [0, 1), got {drop_share}")
    finished = prompts / (1 - drop_share)
    return finished + min(max_inflight * prompts, prompts * drop_share / (1 - drop_share))


def generated_prompts(config: TrainerConfig) -> float:
    """Prompts generated per step: prompts_per_step, or V1's dispatch with Dynamic Sampling."""
    prompts = config.batch.prompts_per_step
    if not config.techniques.dynamic_sampling:
        return prompts
    return v1_prompts_per_step(prompts, EVICTED_SHARE, max_inflight_gen_batches(config))


def verl_jobs(spec: ExperimentSpec, runs: list[PlannedRun]) -> list[VerlJob]:
    """The Ray job of every verl run (`registry.runs_by_backend`); raises VerlTranslationError (one sentence)."""
    return [verl_job(spec, run) for run in runs]


def time_limit(spec: ExperimentSpec, config: TrainerConfig, eval_rows: int | None) -> TimeLimit:
    """The wall-clock limit of one verl cell's job (see the module docstring)."""
    executor = spec.executor
    default = executor.run_timeout_s
    if executor.run_timeout_given:
        return TimeLimit(default)
    hours = gpu_hours(config, eval_rows)
    if hours is None:
        return TimeLimit(default, f"{RUN_TIMEOUT_S}'s default: no estimate without a model size such as -32B in model.path")
    nnodes, per_node = job_shape(executor.gpus_per_run, executor.gpus_per_node)
    wall_h = hours / (nnodes * per_node)
    return TimeLimit(TIME_SAFETY * wall_h * 3600 + STARTUP_S,
                     f"{TIME_SAFETY:g} x the estimated {wall_h:,.1f} h + {STARTUP_S / 3600:g} h start-up; {RUN_TIMEOUT_S} not set")


def time_limits(spec: ExperimentSpec, runs: list[PlannedRun], sets: dict[str, EvalSet | None] | None = None) -> dict[str, TimeLimit]:
    """Run id -> the time limit of each verl run's job (`sets`: their evaluation files, if read already)."""
    sets = eval_sets(runs) if sets is None else sets
    return {run.run_id: time_limit(spec, run.config, _rows(sets, run.config)) for run in runs}


def _rows(sets: dict[str, EvalSet | None], config: TrainerConfig) -> int | None:
    found = sets[config.data.eval]
    return found.rows if found else None


def eval_sets(runs: list[PlannedRun]) -> dict[str, EvalSet | None]:
    """The evaluation parquet of each verl run's config, read where this machine sees it."""
    paths = {run.config.data.eval for run in runs}
    return {path: eval_set(path) for path in sorted(paths)}


def format_estimate(runs: list[PlannedRun], sets: dict[str, EvalSet | None], gpus: int) -> str:
    hours = [gpu_hours(run.config, _rows(sets, run.config)) for run in runs]
    if any(h is None for h in hours):
        return "GPU-hours: unknown (no model size such as -32B in model.path)"
    total = sum(hours)  # type: ignore[arg-type]
    return (
        f"GPU-hours (FLOP estimate, H100 bf16, responses at {MEAN_RESPONSE_SHARE:.0%} of the ceiling, Dynamic "
        f"Sampling evicting {EVICTED_SHARE:.0%} of groups, as verl's V1 dispatches): {total:,.0f} in all, {total / len(hours):,.0f} per run; "
        f"{total / gpus:,.0f} h of wall time on {gpus} GPUs per run, one run at a time"
    )


def format_evaluations(runs: list[PlannedRun], sets: dict[str, EvalSet | None]) -> list[str]:
    """One line per evaluation file: its samples per evaluation (rows x val n) and evaluations per run."""
    lines = []
    for path, found in sets.items():
        config = next(run.config for run in runs if run.config.data.eval == path)
        n, evaluations = config.rollout.eval_k, config.schedule.evaluations
        size = found.describe(n) if found else (f"not on this machine: rows unknown, the estimate assumes "
                                                f"{EVAL_PROBLEMS} x val n {n} = {EVAL_PROBLEMS * n:,} samples per evaluation")
        lines.append(f"  evaluation {path}: {size}; {evaluations} evaluations per run")
    return lines


def format_dynamic_sampling(runs: list[PlannedRun]) -> str | None:
    """What Dynamic Sampling does on verl and what the estimate assumed (None: no run has it on)."""
    config = next((run.config for run in runs if run.config.techniques.dynamic_sampling), None)
    if config is None:
        return None
    prompts, inflight = config.batch.prompts_per_step, max_inflight_gen_batches(config)
    per_step = v1_prompts_per_step(prompts, EVICTED_SHARE, inflight)
    return (f"  dynamic sampling: verl's V1 replay buffer, not the paper's rounds: each step {prompts} prompts, 2 more per "
            f"evicted group, at most {inflight} x {prompts} in flight, all drained once {prompts} groups are kept; no round "
            f"limit (algorithm.max_gen_rounds {DEFAULT_MAX_GEN_ROUNDS} is not applied). The estimate assumes "
            f"{EVICTED_SHARE:.0%} of groups evicted: {per_step:,.0f} prompts generated per step "
            f"({per_step / prompts:.2f} x prompts_per_step)")


def checkpoint_saves(config: TrainerConfig) -> int:
    """Checkpoints a run saves: every checkpoint_every steps and at the last step (verl's rule)."""
    every, total = config.schedule.checkpoint_every, config.schedule.total_steps
    return total // every + (1 if total % every else 0) if every else 0


def _size(n_bytes: float) -> str:
    return f"{n_bytes / 1e12:,.1f} TB" if n_bytes >= 1e12 else f"{n_bytes / 1e9:,.0f} GB"


def format_checkpoints(spec: ExperimentSpec, runs: list[PlannedRun]) -> str:
    """The checkpoint disk of the verl runs: per save, per run while it trains, per run when done;
    and, when a user's override sends them elsewhere, that they are then neither sealed (`verl_seal`)
    nor pruned."""
    config, policy = runs[0].config, spec.executor.checkpoints_when_done
    saves, n = checkpoint_saves(config), model_params(config.model.path)
    if not saves:
        return "  checkpoints: none (schedule.checkpoint_every unset): a failed run starts again from step 0"
    elsewhere = ("; trainer.default_local_dir is overridden: that folder is yours, neither sealed nor pruned, and "
                 "verl resumes from whatever it holds" if own_checkpoint_dir(config, ".") is None else "")
    if n is None:
        return f"  checkpoints: {saves} saves per run; their size unknown (no model size such as -32B in model.path){elsewhere}"
    per_save, kept = CHECKPOINT_BYTES_PER_PARAM * n, config.verl.max_checkpoints
    training = min(saves, max(kept, 2) if kept == 1 else kept) if kept else saves
    done = {"all": min(training, kept or saves), "final": 1, "none": 0}[policy]  # all: what verl left
    limit = f"trainer.verl.max_checkpoints {kept}" if kept else "trainer.verl.max_checkpoints unset: all kept"
    return (f"  checkpoints: {saves} saves per run of {_size(per_save)} each (fp32 weights + AdamW state, "
            f"{CHECKPOINT_BYTES_PER_PARAM} bytes x {n / 1e9:g}B parameters); while a run trains up to {training} kept "
            f"({_size(training * per_save)}, {limit}); once done {policy} (executor.checkpoints_when_done): "
            f"{_size(done * per_save)} per run, {_size(done * per_save * len(runs))} for the {len(runs)} runs{elsewhere}")


def format_concurrency(configs: list[TrainerConfig]) -> str:
    """How many of the jobs may run at once on one Ray cluster, and why (`verl_cluster.jobs_at_once`)."""
    if jobs_at_once(configs) is None:
        return ("  jobs at once on one Ray cluster: up to executor.max_concurrent (or as many as its GPUs fit), each "
                "with its own TransferQueue (Ray namespace transfer_queue-<the job's Ray job id>)")
    return ("  one job at a time on one Ray cluster: a cell's TransferQueue backend or metrics port (trainer.verl.overrides) "
            "is shared by every job on a node")


def format_verl_jobs(spec: ExperimentSpec, verl_runs: list[PlannedRun]) -> str:
    """The GPU-hour estimate, the evaluation's size, what every job shares, and one entrypoint
    per verl run (`registry.runs_by_backend`), exactly as the job receives it."""
    jobs = verl_jobs(spec, verl_runs)  # raises VerlTranslationError (one sentence)
    sets = eval_sets(verl_runs)
    first = jobs[0]
    shared = all(job.env == first.env for job in jobs)
    env = " ".join(f"{key}={value}" for key, value in first.env.items()) if shared else "(per job, below)"
    lines = [
        f"verl jobs ({len(jobs)}, one Ray job each; {format_estimate(verl_runs, sets, first.gpus)}):",
        f"  each job: {first.nnodes} node(s) x {first.gpus_per_node} GPU(s) (verl's placement groups), entrypoint "
        f"{first.num_cpus:g} CPU(s) and no GPU; runtime env: py_modules [{', '.join(first.py_modules)}], "
        f"env {env} MLFLOW_RUN_ID=<the run's MLflow child run>",
        format_concurrency([run.config for run in verl_runs]),
        *format_evaluations(verl_runs, sets),
        *filter(None, [format_dynamic_sampling(verl_runs)]),
        format_checkpoints(spec, verl_runs),
    ]
    refused = shared_tracking_problem(first.env["MLFLOW_TRACKING_URI"], first.nnodes)
    if refused:
        lines.append(f"  run will refuse this spec: {refused}")
    limits = time_limits(spec, verl_runs, sets)
    for run, job in zip(verl_runs, jobs):
        lines.append(f"  [{job.run_name}] {job.entrypoint}")
        lines.append(f"      time limit {limits[run.run_id].describe()}")
        if not shared:
            lines.append("      env " + " ".join(f"{key}={value}" for key, value in job.env.items()))
    return "\n".join(lines)
