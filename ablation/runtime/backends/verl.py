"""TrainerConfig -> verl: the Hydra overrides of ``python3 -m verl.trainer.main_ppo`` for one cell.

Pinned against verl 0.9.1 (``verl/trainer/config/ppo_trainer.yaml``; the test
``tests/unit/test_verl_compose.py`` composes every cell's overrides into that config). verl itself is
never imported here: the overrides are plain strings, run on the cluster.

The five toggles (on / off):

- Overlong Filtering: ``actor.policy_loss.loss_mode=dapo_overlong_filter`` (our loss, registered in
  verl's policy-loss registry by ``dapo_ablate.ablation.runtime.backends.verl_loss``, which verl imports
  through ``VERL_USE_EXTERNAL_MODULES``; verl has no Overlong Filtering of its own) / ``vanilla``.
  A response is truncated when its length reaches ``rollout.max_response_len``, which the job's
  environment gives the loss (``DAPO_ABLATE_MAX_RESPONSE_LEN``): verl's V1 trainer pads each
  micro-batch only to its own longest response, so the tensor's width says nothing. With it,
  ``trainer.v1.trainer_mode=dapo_overlong_filter`` (``verl_trainer``, registered the same way; off:
  verl's ``sync``) takes the truncated responses out of the ``loss_mask`` verl counts before it
  splits a mini-batch, so the loss is an exact global mean over kept tokens (or responses) under any
  micro-batching and data parallelism.
- Clip-Higher: ``clip_ratio_low=eps_low, clip_ratio_high=eps_high`` / both ``eps_low`` (the config's
  ``eps_high_effective``).
- Soft Overlong Punishment: the ``dapo`` reward manager always scores (+1 / -1, as the paper);
  ``reward.reward_kwargs.overlong_buffer_cfg.enable`` true / false, ``len=overlong_cache``,
  ``penalty_factor``, ``max_resp_len=max_response_len``.
- Token-Level Loss: ``loss_agg_mode=token-mean`` / ``seq-mean-token-mean`` (GRPO's mean of means).
- Dynamic Sampling: ``algorithm.filter_groups.{enable=true, metric=acc}`` / ``enable=false``, on
  verl's V1 trainer (``trainer.use_v1=true``, set explicitly: the legacy trainer ignores
  filter_groups without a word). V1's replay buffer is not the recipe's loop of 3 x batch rounds
  stopped after max_num_gen_batches (10): it starts each step with prompts_per_step prompts,
  dispatches 2 new prompts for every group it evicts (all correct or all wrong), one prompt at a
  time, keeps at most ``max_inflight_gen_batches x prompts_per_step`` prompts in flight, trains once
  prompts_per_step mixed groups are finished and discards the surplus. Its only bound is that
  in-flight one: ``max_inflight_gen_batches = ceil(gen_prompts_per_round / prompts_per_step)``, from
  the config's ``gen_prompts_per_round`` (3 by default, the recipe's 3 x batch; 1 off). It has no
  round limit: ``algorithm.max_gen_rounds`` has no verl counterpart (``max_num_gen_batches=0``; V1
  ignores it and warns otherwise), and a step whose groups are never mixed keeps sampling. A value
  other than its default (10) is refused rather than dropped; ``validate`` says the default is not
  applied, and its GPU-hour estimate follows V1's dispatch (``verl_plan.v1_prompts_per_step``).

Open points, decided here:

- Dual clip: verl always applies it (default ``clip_ratio_c=3``; DAPO scripts 10). Ours is off unless
  ``algorithm.clip_ratio_c`` is set, so None becomes ``clip_ratio_c=1e9`` (never active).
- Mini-batches: ours count responses, verl's prompts: ``ppo_mini_batch_size = mini_batch_size /
  group_size`` (refused unless it divides). ``micro_batch_size`` None -> verl's dynamic batch size.
- Scale: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` from ``executor.gpus_per_run`` and
  ``executor.gpus_per_node`` (`job_shape`); the recipe's performance settings from
  ``trainer.verl`` (sequence parallelism, offload, token budgets, truncation, checkpoints kept);
  checkpoints in the run's own folder (``trainer.default_local_dir``, on shared storage), so a retried
  job resumes from the last one (verl's ``resume_mode=auto``), at most ``trainer.verl.max_checkpoints``
  of the actor (and critic) kept while it trains; a done run's are pruned by the driver
  (``verl_checkpoints``, ``executor.checkpoints_when_done``).
- Evaluation: ``val_kwargs`` n=eval_k, do_sample, eval temperature / top_p; verl logs avg@k as
  ``val-core/<data_source>/acc/mean@<k>``. ``schedule.eval_seed`` has no verl counterpart (verl's
  validation uses ``rollout.seed``).
- Seeds: ``data.seed`` and ``rollout.seed`` = ``schedule.seed``.

FlashAttention: verl 0.9.1 loads the model with ``override_config.attn_implementation`` (default
``flash_attention_2``), removes padding by default (``model.use_remove_padding=true``, through
flash-attn's ``bert_padding``), and Ulysses sequence parallelism patches transformers' flash path.
`needs_flash_attn` reads that from the cell's resolved overrides; the cluster check then asks every
node for flash-attn (``verl_cluster``) before any GPU is allocated.

Refused, in one sentence each (`VerlTranslationError`): the built-in model or data, the ``hf``
rollout engine, non +1/-1 rewards, a noisy verifier, truncated samples left out of group stats,
``advantage_eps`` other than verl's 1e-6, a round limit other than the default, with Overlong
Filtering a KL term (``algorithm.kl_coef`` > 0: verl's ``ppo_loss`` adds it over every response
token, the truncated responses' included, and divides it by the kept tokens) or truncated importance
sampling (``algorithm.tis_cap``: our loss takes no rollout importance weights and would fail at the
first update) or an override switching on another every-token term (`TOKEN_TERMS`), a chat template turned off, a GPU count that is not a whole number of nodes, a
``trainer.verl.overrides`` entry that touches a key a technique decides in any of Hydra's forms (the
key, ``+`` / ``++`` / ``~``, a parent replaced by a dict or deleted, a config group's package:
`check_overrides`), and a name or path no Hydra quoting carries (an interpolation ``${``, a control
character: `check_hydra_value`). Other names and paths are quoted where Hydra's override grammar
needs it (`hydra_value`: spaces at the ends, ``( ) [ ] { } , = '``, non-ASCII, values Hydra would
read as numbers, bools or null).
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from dapo_ablate.core.config import BUILTIN, AlgorithmConfig, TrainerConfig
from dapo_ablate.core.contracts import TECHNIQUES

ENTRYPOINT_PYTHON = "python3"
"""The interpreter a job's entrypoint runs: the first ``python3`` on the node's PATH (the cluster
check asks every node whether it is the Python Ray runs verl's workers in)."""
ENTRYPOINT = f"{ENTRYPOINT_PYTHON} -m verl.trainer.main_ppo"
LOSS_MODULE = "dapo_ablate.ablation.runtime.backends.verl_loss"
OVERLONG_FILTER_LOSS = "dapo_overlong_filter"
OVERLONG_FILTER_TRAINER = "dapo_overlong_filter"
"""verl's sync V1 trainer that rewrites ``loss_mask`` to the loss's units before each update
(``verl_trainer``; registered when verl imports its V1 package), so verl's own global count is the
kept tokens or responses."""
NO_DUAL_CLIP = 1e9
MAX_RESPONSE_LEN_ENV = "DAPO_ABLATE_MAX_RESPONSE_LEN"
"""The job's environment gives the Overlong Filtering loss the response ceiling (verl_loss)."""
CHECKPOINT_DIR_KEY = "trainer.default_local_dir"
CHECKPOINT_DIR = "checkpoints"
"""A run's checkpoints go to ``<run folder>/checkpoints`` (``verl_checkpoints`` prunes them there)."""
VERL_VERSION = "0.9.1"
DEFAULT_MAX_GEN_ROUNDS = AlgorithmConfig.model_fields["max_gen_rounds"].default
"""``algorithm.max_gen_rounds``'s default: the only value a verl cell accepts, and one it cannot apply."""
VLLM_BATCHED_TOKENS = 8192
"""verl's default rollout.max_num_batched_tokens: the least we set (vLLM also wants it at least
its max_num_seqs, 256); one longest sequence when that is longer (the recipe's 2048 + 20480)."""
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
    if algo.max_gen_rounds != DEFAULT_MAX_GEN_ROUNDS:
        raise _refuse("algorithm.max_gen_rounds", f"({algo.max_gen_rounds}) cannot be honoured: verl's V1 Dynamic Sampling has no round limit",
                      f"leave it at its default {DEFAULT_MAX_GEN_ROUNDS} (not applied; validate says so) or use backend builtin")
    if config.techniques.overlong_filter and algo.kl_coef > 0:
        raise _refuse("algorithm.kl_coef", f"({algo.kl_coef:g}) with techniques.overlong_filter is not available (verl adds its "
                      "KL term over every response token, the truncated responses' included)",
                      "set it to 0 (DAPO has no KL term) or use backend builtin")
    if config.techniques.overlong_filter and algo.tis_cap is not None:
        raise _refuse("algorithm.tis_cap", "with techniques.overlong_filter is not available (the Overlong Filtering loss takes no "
                      "rollout importance weights)", "leave it unset or use backend builtin")
    if not config.model.use_chat_template:
        raise _refuse("model.use_chat_template", "false is not available (verl applies the chat template)", "leave it true")
    for field, value in (("model.path", config.model.path), ("data.train", config.data.train), ("data.eval", config.data.eval)):
        check_hydra_value(f"trainer.{field}", value)
    check_overrides(config)
    if config.batch.mini_batch_size % algo.group_size:
        raise _refuse(
            "batch.mini_batch_size", f"({config.batch.mini_batch_size}) is not a multiple of group_size ({algo.group_size})",
            "verl counts mini-batches in prompts; make it a multiple",
        )


def technique_overrides(config: TrainerConfig) -> list[str]:
    """The overrides the five toggles decide."""
    return [override for _, override in _decided_overrides(config)]


def _decided_overrides(config: TrainerConfig) -> list[tuple[str, str]]:
    """(the field that decides it, override) for every override a technique decides."""
    t, algo = config.techniques, config.algorithm
    of, ch, sp, tl, ds = (f"techniques.{name}" for name in TECHNIQUES)  # in TECHNIQUES' order
    buffer = "+reward.reward_kwargs.overlong_buffer_cfg"
    inflight = max_inflight_gen_batches(config)
    return [
        (ds, "trainer.use_v1=true"),
        (of, f"trainer.v1.trainer_mode={OVERLONG_FILTER_TRAINER if t.overlong_filter else 'sync'}"),
        (of, f"{A}.policy_loss.loss_mode={OVERLONG_FILTER_LOSS if t.overlong_filter else 'vanilla'}"),
        (ch, f"{A}.clip_ratio_low={algo.eps_low}"),
        (ch, f"{A}.clip_ratio_high={config.eps_high_effective}"),
        ("algorithm.clip_ratio_c", f"{A}.clip_ratio_c={algo.clip_ratio_c if algo.clip_ratio_c is not None else NO_DUAL_CLIP}"),
        (sp, "reward.reward_manager.name=dapo"),
        (sp, f"{buffer}.enable={_bool(t.soft_overlong)}"),
        (sp, f"{buffer}.len={algo.overlong_cache}"),
        (sp, f"{buffer}.penalty_factor={algo.overlong_penalty_factor}"),
        (sp, f"{buffer}.log={_bool(t.soft_overlong)}"),
        (sp, f"+reward.reward_kwargs.max_resp_len={config.rollout.max_response_len}"),
        (tl, f"{A}.loss_agg_mode={'token-mean' if t.token_level_loss else 'seq-mean-token-mean'}"),
        (ds, f"algorithm.filter_groups.enable={_bool(t.dynamic_sampling)}"),
        (ds, "algorithm.filter_groups.metric=acc"),
        (ds, "algorithm.filter_groups.max_num_gen_batches=0"),
        (ds, f"algorithm.filter_groups.max_inflight_gen_batches={inflight}"),
    ]


def max_inflight_gen_batches(config: TrainerConfig) -> int:
    """V1's bound on Dynamic Sampling's prompts in flight, in batches: the config's prompts per round
    over prompts_per_step, rounded up (one batch without Dynamic Sampling, so 1)."""
    return math.ceil(config.gen_prompts_per_round / config.batch.prompts_per_step)


def override_key(override: str) -> str:
    """``++a.b@pkg=1`` -> ``a.b``, ``~a.b`` -> ``a.b`` (Hydra's add / force-add / delete prefixes
    and a config group's target package dropped)."""
    return override.split("=", 1)[0].strip().lstrip("+~").split("@", 1)[0].strip()


def override_targets(override: str) -> list[str]:
    """The dotted config paths an override writes (Hydra's override grammar: ``[~|+|++]key[@package][=value]``):
    its key (a config group ``a/b`` as ``a.b``) and the package a group lands in (``group@a.b``)."""
    key = override.split("=", 1)[0].strip().lstrip("+~")
    return [part.strip().replace("/", ".") for part in key.split("@", 1) if part.strip()]


def technique_keys(config: TrainerConfig) -> dict[str, str]:
    """The verl keys the techniques decide -> the field deciding each (a user's extra override may
    not touch them)."""
    return {override_key(override): field for field, override in _decided_overrides(config)}


def overlap(path: str, key: str) -> bool:
    """Whether writing (or deleting) config path `path` touches `key`: the key itself, a parent of
    it (a dict value or a deletion replaces the whole subtree) or a child of it."""
    return path == key or key.startswith(f"{path}.") or path.startswith(f"{key}.")


TOKEN_TERMS = {f"{A}.entropy_coeff": "at 0", f"{A}.use_kl_loss": "off", f"{A}.kl_loss_coef": "at algorithm.kl_coef, 0"}
"""verl keys of loss terms `ppo_loss` adds over every response token: with Overlong Filtering an
override may not set them (the truncated responses would be trained on through them)."""


def check_overrides(config: TrainerConfig) -> None:
    """Refuse a ``trainer.verl.overrides`` entry that touches a key a technique decides, in any of
    Hydra's forms (``key=``, ``+key=``, ``++key=``, ``~key``, ``parent={...}``, ``group@package=``)."""
    decided = technique_keys(config)
    if config.techniques.overlong_filter:  # loss terms verl adds over every response token, truncated ones included
        decided |= {key: "techniques.overlong_filter (verl adds this term over every token, the truncated ones' "
                    f"included; the product keeps it {value})" for key, value in TOKEN_TERMS.items()}
    for override in config.verl.overrides:
        for path in override_targets(override):
            key = next((key for key in decided if overlap(path, key)), None)
            if key is not None:
                what = "sets" if path == key else ("replaces or deletes a parent of" if key.startswith(f"{path}.") else "sets a key inside")
                raise _refuse("verl.overrides", f"entry {override!r} {what} {key}, which {decided[key]} decides",
                              f"set {decided[key]} (or its knob) instead and leave {key} out of the overrides")


SAFE_VALUE = re.compile(r"[A-Za-z0-9_/+.%*@?|:-]+(?: [A-Za-z0-9_/+.%*@?|:-]+)*")
"""A string Hydra's override grammar takes unquoted as that string: letters, digits and ``_ / + . % *
@ ? | : -``, inner single spaces (Hydra's OverrideLexer: ID, UNQUOTED_CHAR, COLON, WS; ``$`` and ``\\``
start interpolations and escapes, ``( ) [ ] { } , = '`` and non-ASCII letters are grammar or errors)."""
TYPED_VALUE = re.compile(r"(?i)(?=.*\d)[\d_.e+-]+|[+-]?(?:inf|nan)|true|false|null")
"""An unquoted value Hydra reads as a number, a bool or null, not a string."""


def check_hydra_value(field: str, value: str) -> None:
    """Refuse, in one sentence, a string no Hydra quoting carries to verl as written: an OmegaConf
    interpolation (``${``, resolved even inside quotes) or a control character."""
    hidden = next((char for char in value if not char.isprintable()), None)
    if "${" in value or hidden is not None:
        what = "holds ${, which verl's OmegaConf config resolves as an interpolation" if hidden is None else \
            f"holds the control character U+{ord(hidden):04X}, which verl's command line cannot carry"
        raise VerlTranslationError(f"{field} ({value!r}) {what} on backend verl; rename it without it")


def hydra_value(value: str) -> str:
    """`value` as a Hydra override's value that verl reads back as exactly this string: as is when
    Hydra takes it unquoted (`SAFE_VALUE`, not a number, bool or null), else single-quoted with
    Hydra's escapes (a quote and the backslashes before it or at the end doubled and escaped:
    ``_unescape_quoted_string`` in Hydra's override parser), e.g. ``runs/GRPO (v2)`` -> ``'runs/GRPO (v2)'``."""
    if SAFE_VALUE.fullmatch(value) and not TYPED_VALUE.fullmatch(value):
        return value
    body = re.sub(r"(\\*)('|\Z)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return f"'{body}'"


def knob_overrides(config: TrainerConfig) -> list[str]:
    """Every other knob: model, data, rollout, algorithm, optimiser, batch, schedule, seeds."""
    return (_model_and_data(config) + _update(config) + _rollout(config) + _sharding(config)
            + _evaluation_and_schedule(config) + _micro_batches(config) + _rollout_correction(config))


def _longest_sequence(config: TrainerConfig) -> int:
    """One whole sequence in tokens: the longest prompt and the longest response (the recipe's
    token budgets when ``trainer.verl`` leaves them unset)."""
    return config.verl.max_prompt_length + config.rollout.max_response_len


def _model_and_data(config: TrainerConfig) -> list[str]:
    m, d, v = config.model, config.data, config.verl
    return [
        f"actor_rollout_ref.model.path={hydra_value(m.path)}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={_bool(m.gradient_checkpointing)}",
        f"data.train_files={hydra_value(d.train)}",
        f"data.val_files={hydra_value(d.eval)}",
        f"data.max_prompt_length={v.max_prompt_length}",
        f"data.truncation={v.truncation}",
        f"data.max_response_length={config.rollout.max_response_len}",
        f"data.train_batch_size={config.batch.prompts_per_step}",
        f"data.seed={config.schedule.seed}",
    ]


def _update(config: TrainerConfig) -> list[str]:
    """GRPO's advantages, the KL penalty, AdamW and the mini-batches (verl counts them in prompts)."""
    algo, o, b = config.algorithm, config.optim, config.batch
    return [
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
    ]


def _rollout(config: TrainerConfig) -> list[str]:
    """vLLM's sampling for training (a float32 model.dtype, the built-in trainer's default, samples
    in bfloat16) and its engine settings."""
    m, r, v = config.model, config.rollout, config.verl
    return [
        f"{R}.name=vllm",
        f"{R}.n={config.algorithm.group_size}",
        f"{R}.temperature={r.temperature}",
        f"{R}.top_p={r.top_p}",
        f"{R}.seed={config.schedule.seed}",
        f"{R}.dtype={'bfloat16' if m.dtype == 'float32' else m.dtype}",
        f"{R}.gpu_memory_utilization={r.gpu_memory_utilization}",
        f"{R}.tensor_model_parallel_size={r.tensor_parallel_size}",
        f"{R}.max_num_batched_tokens={v.max_num_batched_tokens or max(_longest_sequence(config), VLLM_BATCHED_TOKENS)}",
        f"{R}.enable_chunked_prefill=true",
    ]


def _sharding(config: TrainerConfig) -> list[str]:
    """Sequence parallelism and FSDP offload of the actor and the reference (the recipe's memory settings)."""
    v = config.verl
    return [
        f"{A}.ulysses_sequence_parallel_size={v.sequence_parallel_size}",
        f"{A}.fsdp_config.param_offload={_bool(v.param_offload)}",
        f"{A}.fsdp_config.optimizer_offload={_bool(v.optimizer_offload)}",
        f"actor_rollout_ref.ref.fsdp_config.param_offload={_bool(v.param_offload)}",
    ]


def _evaluation_and_schedule(config: TrainerConfig) -> list[str]:
    """avg@k sampling, run length, when to validate and checkpoint, and resuming from the last checkpoint."""
    r, s, v = config.rollout, config.schedule, config.verl
    return [
        f"{R}.val_kwargs.n={r.eval_k}",
        f"{R}.val_kwargs.do_sample=true",
        f"{R}.val_kwargs.temperature={r.eval_temperature}",
        f"{R}.val_kwargs.top_p={r.eval_top_p}",
        f"trainer.total_training_steps={s.total_steps}",
        f"trainer.test_freq={s.eval_every or s.total_steps}",  # verl validates the last step only when > 0
        "trainer.val_before_train=true",
        f"trainer.save_freq={s.checkpoint_every or -1}",
        f"trainer.max_actor_ckpt_to_keep={v.max_checkpoints if v.max_checkpoints is not None else 'null'}",
        f"trainer.max_critic_ckpt_to_keep={v.max_checkpoints if v.max_checkpoints is not None else 'null'}",
        "trainer.resume_mode=auto",
    ]


def _micro_batches(config: TrainerConfig) -> list[str]:
    """``batch.micro_batch_size`` None: verl's dynamic batch size (the recipe's), the log-prob passes
    following the actor's token budget; else that micro-batch for the update and both log-prob
    passes (verl asks for each)."""
    micro = config.batch.micro_batch_size
    if micro is None:
        tokens = config.verl.max_token_len_per_gpu or _longest_sequence(config)
        return [f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu={tokens}"]
    return [f"{A}.ppo_micro_batch_size_per_gpu={micro}",
            f"{R}.log_prob_micro_batch_size_per_gpu={micro}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}"]


def _rollout_correction(config: TrainerConfig) -> list[str]:
    """Truncated importance sampling (``algorithm.tis_cap``), token-level, as verl's rollout correction."""
    cap = config.algorithm.tis_cap
    if cap is None:
        return []
    return ["algorithm.rollout_correction.rollout_is=token", f"algorithm.rollout_correction.rollout_is_threshold={cap}"]


def job_shape(gpus_per_run: float, gpus_per_node: int) -> tuple[int, int]:
    """(nnodes, n_gpus_per_node) of a job of `gpus_per_run` GPUs on nodes of `gpus_per_node`:
    a whole number of GPUs, on one node or on whole nodes (verl's resource pool is nnodes x
    n_gpus_per_node)."""
    if gpus_per_run < 1 or gpus_per_run != int(gpus_per_run):
        raise VerlTranslationError(
            f"executor.gpus_per_run ({gpus_per_run:g}) must be a whole number of GPUs, at least 1, on backend verl; "
            "set the GPUs each verl job trains on (e.g. 128 for 16 nodes of 8)"
        )
    gpus = int(gpus_per_run)
    if gpus <= gpus_per_node:
        return 1, gpus
    if gpus % gpus_per_node:
        raise VerlTranslationError(
            f"executor.gpus_per_run ({gpus}) is not a whole number of nodes of executor.gpus_per_node ({gpus_per_node}) "
            f"on backend verl; use a multiple of {gpus_per_node}"
        )
    return gpus // gpus_per_node, gpus_per_node


def cluster_overrides(nnodes: int, gpus_per_node: int, project: str, run_name: str, run_dir: str) -> list[str]:
    """Nodes and GPUs of one cell's job, its checkpoints in the run's folder, and MLflow as its
    logger (the run itself is chosen by ``MLFLOW_RUN_ID`` in the job's environment, so verl logs
    into the cell's child run). Names and paths are quoted for Hydra where they need it (`hydra_value`);
    one no quoting carries is refused (`check_hydra_value`)."""
    named = (("name (the experiment's, verl's trainer.project_name)", project), ("the run's name (trainer.experiment_name)", run_name),
             ("output_dir (the run's folder, where its checkpoints go)", run_dir))
    for field, value in named:
        check_hydra_value(field, value)
    return [
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={gpus_per_node}",
        f"{CHECKPOINT_DIR_KEY}={hydra_value(f'{run_dir}/{CHECKPOINT_DIR}')}",
        "trainer.logger=[console,mlflow]",
        f"trainer.project_name={hydra_value(project)}",
        f"trainer.experiment_name={hydra_value(run_name)}",
    ]


def verl_overrides(config: TrainerConfig, *, nnodes: int = 1, gpus_per_node: int = 8, project: str = "dapo-ablate",
                   run_name: str = "cell", run_dir: str = "cell") -> list[str]:
    """Every override of one cell (refusing what verl cannot do); the user's own
    ``trainer.verl.overrides`` come last."""
    check_translatable(config)
    return (technique_overrides(config) + knob_overrides(config)
            + cluster_overrides(nnodes, gpus_per_node, project, run_name, run_dir) + list(config.verl.overrides))


def job_env(config: TrainerConfig, tracking_uri: str) -> dict[str, str]:
    """Environment of a verl job (besides ``MLFLOW_RUN_ID``, the cell's MLflow child run, set when
    it is submitted): our loss module imported by verl with the response ceiling, MLflow's store."""
    return {"VERL_USE_EXTERNAL_MODULES": LOSS_MODULE, MAX_RESPONSE_LEN_ENV: str(config.rollout.max_response_len),
            "MLFLOW_TRACKING_URI": tracking_uri}


ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
REMOVE_PADDING_KEY = "actor_rollout_ref.model.use_remove_padding"
VERL_DEFAULTS = {ATTN_KEY: "flash_attention_2", REMOVE_PADDING_KEY: "true"}
"""verl 0.9.1's values of the keys that decide whether flash-attn is needed (workers/config/model.py,
trainer/config/model/hf_model.yaml)."""


def resolved(overrides: list[str], key: str) -> str:
    """The value `key` takes in verl's config given `overrides` (the last one setting it wins, as
    in Hydra), else verl's default (`VERL_DEFAULTS`)."""
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == key]
    return values[-1] if values else VERL_DEFAULTS[key]


def needs_flash_attn(config: TrainerConfig) -> bool:
    """Whether a cell's verl job imports flash-attn: FlashAttention 2 as the attention, padding
    removal, or Ulysses sequence parallelism (> 1)."""
    overrides = list(config.verl.overrides)
    return (resolved(overrides, ATTN_KEY) == "flash_attention_2"
            or resolved(overrides, REMOVE_PADDING_KEY).lower() == "true"
            or config.verl.sequence_parallel_size > 1)


def verl_command(overrides: list[str]) -> str:
    """The shell command of a cell (what a Ray job's entrypoint runs)."""
    return " ".join([ENTRYPOINT, *(shlex.quote(o) for o in overrides)])


def _bool(value: bool) -> str:
    return "true" if value else "false"


def describe() -> dict[str, Any]:
    """The translation's fixed choices (for reports and validate)."""
    return {"verl": VERL_VERSION, "entrypoint": ENTRYPOINT, "loss_module": LOSS_MODULE, "no_dual_clip": NO_DUAL_CLIP}
