"""TrainerConfig -> verl: the Hydra overrides of ``python3 -m verl.trainer.main_ppo`` for one cell.

Pinned against verl 0.9.1 (``verl/trainer/config/ppo_trainer.yaml``; the test
``tests/test_verl_compose.py`` composes every cell's overrides into that config). verl itself is
never imported here: the overrides are plain strings, run on the cluster.

The five toggles (on / off):

- Overlong Filtering: ``actor.policy_loss.loss_mode=dapo_overlong_filter`` (our loss, registered in
  verl's policy-loss registry by ``dapo_ablate.ablation.backends.verl_loss``, which verl imports
  through ``VERL_USE_EXTERNAL_MODULES``; verl has no Overlong Filtering of its own) / ``vanilla``.
- Clip-Higher: ``clip_ratio_low=eps_low, clip_ratio_high=eps_high`` / both ``eps_low``.
- Soft Overlong Punishment: the ``dapo`` reward manager always scores (+1 / -1, as the paper);
  ``reward.reward_kwargs.overlong_buffer_cfg.enable`` true / false, ``len=overlong_cache``,
  ``penalty_factor``, ``max_resp_len=max_response_len``.
- Token-Level Loss: ``loss_agg_mode=token-mean`` / ``seq-mean-token-mean`` (GRPO's mean of means).
- Dynamic Sampling: ``algorithm.filter_groups.{enable=true, metric=acc, max_num_gen_batches=
  max_gen_rounds}`` with ``data.gen_batch_size=gen_prompts_per_round`` (None: 3 x prompts_per_step)
  / ``enable=false`` and ``gen_batch_size=prompts_per_step``.

Open points, decided here:

- Dual clip: verl always applies it (default ``clip_ratio_c=3``; DAPO scripts 10). Ours is off unless
  ``algorithm.clip_ratio_c`` is set, so None becomes ``clip_ratio_c=1e9`` (never active).
- Mini-batches: ours count responses, verl's prompts: ``ppo_mini_batch_size = mini_batch_size /
  group_size`` (refused unless it divides). ``micro_batch_size`` None -> verl's dynamic batch size.
- Evaluation: ``val_kwargs`` n=eval_k, do_sample, eval temperature / top_p; verl logs avg@k as
  ``val-core/<data_source>/acc/mean@<k>``. ``schedule.eval_seed`` has no verl counterpart (verl's
  validation uses ``rollout.seed``).
- Seeds: ``data.seed`` and ``rollout.seed`` = ``schedule.seed``.

Refused, in one sentence each (`VerlTranslationError`): the built-in model or data, the ``hf``
rollout engine, non +1/-1 rewards, a noisy verifier, truncated samples left out of group stats,
``advantage_eps`` other than verl's 1e-6, and a chat template turned off.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from dapo_ablate.core.config import BUILTIN, TrainerConfig

ENTRYPOINT = "python3 -m verl.trainer.main_ppo"
LOSS_MODULE = "dapo_ablate.ablation.backends.verl_loss"
OVERLONG_FILTER_LOSS = "dapo_overlong_filter"
NO_DUAL_CLIP = 1e9
MAX_PROMPT_LENGTH = 2048  # the DAPO scripts' data.max_prompt_length
GPUS_PER_NODE = 8
VERL_VERSION = "0.9.1"
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


class VerlTranslationError(ValueError):
    """A TrainerConfig verl cannot run; the message is one sentence naming the field and the fix."""


def _refuse(field: str, why: str, fix: str) -> VerlTranslationError:
    return VerlTranslationError(f"trainer.{field} {why} on backend verl; {fix}")


def check_translatable(config: TrainerConfig) -> None:
    """Raise VerlTranslationError for anything verl cannot do."""
    algo = config.algorithm
    if config.model.path == BUILTIN:
        raise _refuse("model.path", "is the built-in policy, which does not exist", "set a Hugging Face model path (e.g. Qwen/Qwen2.5-32B)")
    for name in ("train", "eval"):
        if getattr(config.data, name) == BUILTIN:
            raise _refuse(f"data.{name}", "is the built-in arithmetic set, which verl cannot read", "set a parquet file in verl's format")
    if config.rollout.engine == "hf":
        raise _refuse("rollout.engine", "is hf, which is not a verl rollout", "set rollout.engine: vllm")
    if (algo.reward_correct, algo.reward_wrong) != (1.0, -1.0):
        raise _refuse("algorithm.reward_correct/reward_wrong", "differ from +1/-1, the dapo reward manager's scores", "leave them at 1 and -1")
    if algo.reward_flip:
        raise _refuse("algorithm.reward_flip", "(a noisy verifier) is not available", "set it to 0")
    if not algo.filtered_in_group_stats:
        raise _refuse("algorithm.filtered_in_group_stats", "false is not available (verl's GRPO counts every response)", "leave it true")
    if algo.advantage_eps != 1e-6:
        raise _refuse("algorithm.advantage_eps", f"({algo.advantage_eps:g}) is fixed at 1e-6 in verl's GRPO", "leave it at 1e-6")
    if not config.model.use_chat_template:
        raise _refuse("model.use_chat_template", "false is not available (verl applies the chat template)", "leave it true")
    if config.batch.mini_batch_size % algo.group_size:
        raise _refuse(
            "batch.mini_batch_size", f"({config.batch.mini_batch_size}) is not a multiple of group_size ({algo.group_size})",
            "verl counts mini-batches in prompts; make it a multiple",
        )


def technique_overrides(config: TrainerConfig) -> list[str]:
    """The overrides the five toggles decide."""
    t, algo, batch = config.techniques, config.algorithm, config.batch
    eps_high = algo.eps_high if t.clip_higher else algo.eps_low
    gen_batch = (algo.gen_prompts_per_round or 3 * batch.prompts_per_step) if t.dynamic_sampling else batch.prompts_per_step
    buffer = "+reward.reward_kwargs.overlong_buffer_cfg"
    return [
        f"{A}.policy_loss.loss_mode={OVERLONG_FILTER_LOSS if t.overlong_filter else 'vanilla'}",
        f"{A}.clip_ratio_low={algo.eps_low}",
        f"{A}.clip_ratio_high={eps_high}",
        f"{A}.clip_ratio_c={algo.clip_ratio_c if algo.clip_ratio_c is not None else NO_DUAL_CLIP}",
        "reward.reward_manager.name=dapo",
        f"{buffer}.enable={_bool(t.soft_overlong)}",
        f"{buffer}.len={algo.overlong_cache}",
        f"{buffer}.penalty_factor={algo.overlong_penalty_factor}",
        f"{buffer}.log=false",
        f"+reward.reward_kwargs.max_resp_len={config.rollout.max_response_len}",
        f"{A}.loss_agg_mode={'token-mean' if t.token_level_loss else 'seq-mean-token-mean'}",
        f"algorithm.filter_groups.enable={_bool(t.dynamic_sampling)}",
        "algorithm.filter_groups.metric=acc",
        f"algorithm.filter_groups.max_num_gen_batches={algo.max_gen_rounds}",
        f"data.gen_batch_size={gen_batch}",
    ]


def knob_overrides(config: TrainerConfig) -> list[str]:
    """Every other knob: model, data, rollout, algorithm, optimiser, batch, schedule, seeds."""
    m, d, r, algo, o, b, s = (config.model, config.data, config.rollout, config.algorithm, config.optim,
                              config.batch, config.schedule)
    out = [
        f"actor_rollout_ref.model.path={m.path}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={_bool(m.gradient_checkpointing)}",
        f"data.train_files={d.train}",
        f"data.val_files={d.eval}",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={r.max_response_len}",
        f"data.train_batch_size={b.prompts_per_step}",
        f"data.seed={s.seed}",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "algorithm.use_kl_in_reward=false",
        f"{A}.use_kl_loss={_bool(algo.kl_coef > 0)}",
        f"{A}.kl_loss_coef={algo.kl_coef}",
        f"{A}.kl_loss_type=low_var_kl",
        f"{A}.entropy_coeff=0",
        f"{A}.optim.lr={o.lr}",
        f"{A}.optim.lr_warmup_steps={o.warmup_steps}",
        f"{A}.optim.weight_decay={o.weight_decay}",
        f"{A}.optim.betas=[{o.betas[0]},{o.betas[1]}]",
        f"{A}.grad_clip={o.grad_clip}",
        f"{A}.ppo_mini_batch_size={b.mini_batch_size // algo.group_size}",
        f"{A}.ppo_epochs={b.epochs}",
        f"{R}.name=vllm",
        f"{R}.n={algo.group_size}",
        f"{R}.temperature={r.temperature}",
        f"{R}.top_p={r.top_p}",
        f"{R}.seed={s.seed}",
        f"{R}.dtype={'bfloat16' if m.dtype == 'float32' else m.dtype}",
        f"{R}.gpu_memory_utilization={r.gpu_memory_utilization}",
        f"{R}.tensor_model_parallel_size={r.tensor_parallel_size}",
        f"{R}.val_kwargs.n={r.eval_k}",
        f"{R}.val_kwargs.do_sample=true",
        f"{R}.val_kwargs.temperature={r.eval_temperature}",
        f"{R}.val_kwargs.top_p={r.eval_top_p}",
        f"trainer.total_training_steps={s.total_steps}",
        f"trainer.test_freq={s.eval_every or -1}",
        "trainer.val_before_train=true",
        f"trainer.save_freq={s.checkpoint_every or -1}",
    ]
    if b.micro_batch_size is None:
        tokens = 2 * (MAX_PROMPT_LENGTH + r.max_response_len)
        out += [f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu={tokens}"]
    else:
        out += [f"{A}.ppo_micro_batch_size_per_gpu={b.micro_batch_size}"]
    if algo.tis_cap is not None:
        out += ["algorithm.rollout_correction.rollout_is=token", f"algorithm.rollout_correction.rollout_is_threshold={algo.tis_cap}"]
    return out


def cluster_overrides(gpus: float, project: str, run_name: str) -> list[str]:
    """Nodes and GPUs of one cell's job, and MLflow as its logger (the run itself is chosen by
    ``MLFLOW_RUN_ID`` in the job's environment, so verl logs into the cell's child run)."""
    gpus_int = max(1, math.ceil(gpus))
    nodes = max(1, math.ceil(gpus_int / GPUS_PER_NODE))
    return [
        f"trainer.nnodes={nodes}",
        f"trainer.n_gpus_per_node={min(gpus_int, GPUS_PER_NODE)}",
        "trainer.logger=[console,mlflow]",
        f"trainer.project_name={project}",
        f"trainer.experiment_name={run_name}",
    ]


def verl_overrides(config: TrainerConfig, *, gpus: float = 8, project: str = "dapo-ablate", run_name: str = "cell") -> list[str]:
    """Every override of one cell (refusing what verl cannot do)."""
    check_translatable(config)
    return technique_overrides(config) + knob_overrides(config) + cluster_overrides(gpus, project, run_name)


def job_env(tracking_uri: str, mlflow_run_id: str = "$MLFLOW_RUN_ID") -> dict[str, str]:
    """Environment of a verl job: our loss module imported by verl, MLflow into the cell's run."""
    return {"VERL_USE_EXTERNAL_MODULES": LOSS_MODULE, "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_RUN_ID": mlflow_run_id}


def verl_command(overrides: list[str], env: dict[str, str] | None = None) -> str:
    """The shell command of a cell (what a Ray job's entrypoint runs)."""
    prefix = " ".join(f"{k}={shlex.quote(v) if not v.startswith('$') else v}" for k, v in (env or {}).items())
    body = " ".join([ENTRYPOINT, *(shlex.quote(o) for o in overrides)])
    return f"{prefix} {body}" if prefix else body


def _bool(value: bool) -> str:
    return "true" if value else "false"


def describe() -> dict[str, Any]:
    """The translation's fixed choices (for reports and validate)."""
    return {"verl": VERL_VERSION, "entrypoint": ENTRYPOINT, "loss_module": LOSS_MODULE, "no_dual_clip": NO_DUAL_CLIP}
