"""`train(config) -> RunResult`: GRPO with DAPO's five techniques as independent toggles.

One rollout step:
  1. sample prompts; roll out G responses each with behaviour log-probs;
  2. verify; reward = +1 / -1 (truncated responses are wrong), plus the soft overlong penalty
     when `soft_overlong` is on;
  3. with `dynamic_sampling`, keep only groups whose *raw correctness* is mixed, generating more
     rounds until `prompts_per_step` groups are kept (surplus kept groups are discarded, their
     tokens counted as discarded); after `max_gen_rounds` train on what was kept and log it;
  4. group-normalised advantages; with `overlong_filter`, truncated responses get zero loss weight;
  5. shuffled mini-batches of `mini_batch_size` responses, one AdamW update each, against the
     behaviour log-probs, with the clipped surrogate (eps_high only with `clip_higher`) averaged
     per token (`token_level_loss`) or per sample (GRPO).
How this departs from verl's DAPO recipe by default (each is a documented knob or stated here):
  - no dual clip (`algorithm.clip_ratio_c` None; verl's DAPO script sets 10.0);
  - the `auto` verifier: DAPO's `Answer:` line, then math-verify equivalence and a \\boxed{}
    fallback (verl's DAPO reward is the answer line alone: `data.verifier: answer_line`);
  - a truncated response counts as wrong whatever it says (it has no final answer);
  - mini-batches shuffle responses, not groups;
  - Overlong Filtering on (the paper's table has it; verl's DAPO runs rely on the soft penalty);
  - fp32 master weights with bf16 compute under autocast, as verl's FSDP mixed precision.
The CPU quickstart also shrinks the scale (model, batch, ceiling, steps) and raises the learning rate.

No global state: everything a run needs is built from the config, and every random draw comes
from a generator seeded by the config, so the same config gives the same result (the same bits on
any x86-64 CPU with AVX2: `numerics.pin_cpu_numerics` pins the CPU kernels' path), and a run
resumed from a step-boundary checkpoint gives the same result as an uninterrupted one. (With the
math-verify fallback of the verifier, a check that hits its time bound counts as wrong, so
determinism also assumes no check times out; DAPO's own `answer_line` verifier never does.)

Points to know:
- with `filtered_in_group_stats: false`, a group that is mixed only through a truncated wrong
  sample is kept by dynamic sampling (correctness is raw) but has zero advantages;
- prompts are drawn in shuffled passes over the training set; a round that crosses a pass
  boundary can hold the same prompt twice (verl's dataloader would not).
"""

from __future__ import annotations

import copy
import logging
import os
import random
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from . import algorithms as alg
from .checkpoints import UntrustedCheckpoint, load_sealed, save_sealed
from .config import BUILTIN, ConfigError, TrainerConfig
from .data import (  # noqa: F401  (the built-in seeds are re-exported: tests and benchmarks read them here)
    BUILTIN_EVAL_SEED,
    BUILTIN_EVAL_SIZE,
    BUILTIN_TRAIN_SEED,
    apply_prompt_template,
    builtin_problems,
    decontaminate,
    load_eval_set,
    load_problems,
)
from .evaluation import EvalSettings, cached_initial_eval, evaluate, initial_eval_key, score_rollout
from .numerics import numerics_tag, pin_cpu_numerics
from .policy import Policy, load_policy
from .result import RunResult
from .seals import UNKEYED
from .rollout import HFRolloutEngine, Rollout, RolloutEngine, derive_seed
from .update import (  # noqa: F401  (re-exported: the trainer's public names)
    NonFiniteError,
    StepBatch,
    compute_advantages,
    flip_verdicts,
    format_credit,
    importance_advantages,
    loss_mask,
    policy_loss,
    recompute_behaviour_log_probs,
    response_log_probs,
    shape_rewards,
    update_policy,
)
from .verifier import Verifier
from .vllm_engine import VLLMRolloutEngine  # imports vLLM itself only when an engine is built

logger = logging.getLogger(__name__)

SIGNALS = {
    "step": "rollout step (1-based)",
    "reward": "mean reward of the trained responses (penalty included)",
    "accuracy": "share of all generated responses verified correct",
    "entropy": "mean token entropy of the policy on trained tokens (nats)",
    "response_length": "mean generated response length (tokens, EOS included)",
    "response_length_max": "longest generated response",
    "truncation_rate": "share of generated responses without EOS within the ceiling",
    "overlong_rate": "share of generated responses longer than the soft-penalty start",
    "penalty": "mean soft overlong penalty of the trained responses (0 when soft_overlong is off)",
    "clipfrac_low": "share of trained tokens where the lower clip bound was active",
    "clipfrac_high": "share of trained tokens where the upper clip bound was active",
    "approx_kl": "mean (behaviour - current) log-prob over trained tokens",
    "groups_kept": "share of generated groups kept for training (1 without dynamic sampling)",
    "groups_mixed": "share of generated groups with mixed correctness",
    "gen_rounds": "generation rounds this step",
    "ds_exhausted": "1 if max_gen_rounds ended the step with fewer kept groups than asked",
    "tokens_generated": "response tokens generated this step, discarded ones included",
    "tokens_discarded": "generated tokens of groups dropped by dynamic sampling",
    "tokens_trained": "tokens with nonzero loss weight",
    "grad_norm": "mean global gradient norm before clipping over this step's updates",
    "lr": "learning rate used this step",
    "time_rollout_s": "seconds generating",
    "time_reward_s": "seconds verifying and scoring",
    "time_update_s": "seconds in forward/backward/optimizer",
    "rollout_logprob_diff": "mean |trainer - rollout engine| log-prob of the sampled tokens, before the update "
                            "(all tokens when recomputed: vLLM, bf16; else the first mini-batch's). With top_p < 1 "
                            "vLLM's values are renormalised over the nucleus, so the gap also holds log(nucleus mass)",
    "rollout_logprob_diff_max": "largest such per-token gap this step",
}
"""Every per-step signal, documented (also logged to MLflow under these names)."""

Callback = Callable[[str, int, dict[str, Any]], None]
"""callback(kind, step, data): kind is "step" (data: signals) or "eval" (data: metrics)."""


# ------------------------------------------------------------------------------------- problems
@dataclass
class PromptSampler:
    """Shuffled passes over the training problems, resumable from its state."""

    size: int
    seed: int
    epoch: int = 0
    cursor: int = 0
    order: list[int] = field(default_factory=list)

    def draw(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            if self.cursor >= len(self.order):
                self.order = list(range(self.size))
                random.Random(self.seed * 7919 + self.epoch).shuffle(self.order)
                self.epoch, self.cursor = self.epoch + 1, 0
            take = min(n - len(out), len(self.order) - self.cursor)
            out += self.order[self.cursor : self.cursor + take]
            self.cursor += take
        return out

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "order": self.order}


@dataclass
class TrainingPrompts:
    """The training problems as the steps draw them: shuffled passes (`sampler`), each prompt
    tokenized once and cached in `encoded` (problem index -> token ids) for the rest of the run."""

    problems: list[tuple[Any, str]]  # (prompt, answer) pairs
    sampler: PromptSampler
    encoded: dict[int, list[int]] = field(default_factory=dict)

    def draw(self, n: int, policy: Policy) -> tuple[list[list[int]], list[str]]:
        """The next `n` problems: (their encoded prompts, their answers)."""
        idx = self.sampler.draw(n)
        for i in idx:
            if i not in self.encoded:
                self.encoded[i] = policy.encode_prompt(self.problems[i][0])
        return [self.encoded[i] for i in idx], [self.problems[i][1] for i in idx]


@dataclass
class Task:
    """Training and held-out problems as (prompt after data.prompt_template, answer) pairs."""

    train: list[tuple[Any, str]]
    held_out: list[tuple[Any, str]]
    decontaminated: int
    """Training problems removed because their normalised text is a held-out problem's."""


def load_task(config: TrainerConfig) -> Task:
    """The held-out set first, then the training problems minus any whose normalised text is in it
    (built-in task and files alike, so training and evaluation are disjoint by construction)."""
    data = config.data
    if data.eval == BUILTIN:
        held_out = builtin_problems(data, "eval")
    else:
        held_out = load_eval_set(data.eval)
        if data.num_eval_problems is not None and data.num_eval_problems < len(held_out):
            logger.warning("data.num_eval_problems %d evaluates only the first %d of the %d problems in %s; "
                           "leave it unset to evaluate all", data.num_eval_problems, data.num_eval_problems,
                           len(held_out), data.eval)
            held_out = held_out[: data.num_eval_problems]
    if data.train == BUILTIN:
        train = builtin_problems(data, "train")
    else:
        train = load_problems(data.train)
    train, removed = decontaminate(train, held_out)
    template = config.prompt_template
    return Task(
        train=[(apply_prompt_template(p.prompt, template), p.answer) for p in train],
        held_out=[(apply_prompt_template(p.prompt, template), p.answer) for p in held_out],
        decontaminated=removed,
    )


# ------------------------------------------------------------------------------------ the batch
@dataclass
class RoundTally:
    """What the generation rounds of one step saw, for the step's signals."""

    rounds: int = 0
    groups_seen: int = 0
    groups_mixed: int = 0
    n_kept: int = 0
    tokens_generated: int = 0
    tokens_discarded: int = 0
    n_samples: int = 0
    n_correct: int = 0
    n_truncated: int = 0
    n_overlong: int = 0
    lengths_sum: float = 0.0
    length_max: int = 0
    t_roll: float = 0.0
    t_reward: float = 0.0

    def add(self, rollout: Rollout, correct: torch.Tensor, mixed: torch.Tensor, kept_rows: torch.Tensor,
            penalty_start: int) -> None:
        self.tokens_generated += rollout.num_tokens
        self.tokens_discarded += rollout.num_tokens - int(rollout.lengths[kept_rows].sum())
        self.groups_seen += len(mixed)
        self.groups_mixed += int(mixed.sum())
        self.n_samples += len(correct)
        self.n_correct += int(correct.sum())
        self.n_truncated += int(rollout.truncated.sum())
        self.n_overlong += int((rollout.lengths > penalty_start).sum())
        self.lengths_sum += float(rollout.lengths.sum())
        self.length_max = max(self.length_max, int(rollout.lengths.max()))

    def stats(self, dynamic_sampling: bool, want: int) -> dict[str, float]:
        n = self.n_samples
        return {
            "accuracy": self.n_correct / n,
            "response_length": self.lengths_sum / n,
            "response_length_max": float(self.length_max),
            "truncation_rate": self.n_truncated / n,
            "overlong_rate": self.n_overlong / n,
            "groups_kept": self.n_kept / self.groups_seen,
            "groups_mixed": self.groups_mixed / self.groups_seen,
            "gen_rounds": float(self.rounds),
            "ds_exhausted": float(dynamic_sampling and self.n_kept < want),
            "tokens_generated": float(self.tokens_generated),
            "tokens_discarded": float(self.tokens_discarded),
            "time_rollout_s": self.t_roll,
            "time_reward_s": self.t_reward,
        }


def collect_batch(
    config: TrainerConfig,
    engine: RolloutEngine,
    policy: Policy,
    verifier: Verifier,
    prompts: TrainingPrompts,
    step: int,
) -> StepBatch:
    """Generate, verify, reward and (with dynamic sampling) filter until the batch is full."""
    tech, algo, roll = config.techniques, config.algorithm, config.rollout
    G, want = algo.group_size, config.batch.prompts_per_step
    kept: list[tuple[Rollout, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    tally = RoundTally()
    while True:
        tally.rounds += 1
        prompt_ids, answers = prompts.draw(config.gen_prompts_per_round, policy)
        t0 = time.perf_counter()
        rollout = engine.generate(
            prompt_ids, G, roll.temperature, roll.top_p, roll.max_response_len,
            seed=derive_seed(config.schedule.seed, step, tally.rounds),
        )
        t1 = time.perf_counter()
        texts, correct = score_rollout(rollout, [a for a in answers for _ in range(G)], policy.decode, verifier)
        # a noisy verifier (algorithm.reward_flip): rewards, the DS filter and `accuracy` see the flipped verdicts
        correct = flip_verdicts(correct, algo.reward_flip, derive_seed(config.schedule.seed, step, tally.rounds, 1))
        rewards, penalty = shape_rewards(config, correct, rollout.lengths)
        rewards = rewards + format_credit(config, texts, correct, rollout.truncated)  # algorithm.format_reward
        tally.t_roll += t1 - t0
        tally.t_reward += time.perf_counter() - t1

        correct_g = correct.view(len(prompt_ids), G)
        mixed = alg.keep_mixed_groups(correct_g)
        keep = mixed if tech.dynamic_sampling else torch.ones(len(prompt_ids), dtype=torch.bool)
        keep_groups = keep.nonzero().squeeze(-1)[: want - tally.n_kept]  # surplus kept groups are discarded
        rows = (keep_groups[:, None] * G + torch.arange(G)).reshape(-1)
        if len(keep_groups):
            kept.append((rollout.select(rows), rewards.view(-1, G)[keep_groups], correct_g[keep_groups],
                         penalty.view(-1, G)[keep_groups]))
        tally.n_kept += len(keep_groups)
        tally.add(rollout, correct, mixed, rows, roll.max_response_len - algo.overlong_cache)
        if tally.n_kept >= want or not tech.dynamic_sampling or tally.rounds >= algo.max_gen_rounds:
            break
    stats = tally.stats(tech.dynamic_sampling, want)
    if not kept:
        empty = torch.zeros((0, G))
        return StepBatch(None, empty, empty.bool(), empty, stats)
    return StepBatch(
        rollout=Rollout.concat([k[0] for k in kept], policy.pad_token_id),
        rewards=torch.cat([k[1] for k in kept]),
        correct=torch.cat([k[2] for k in kept]),
        penalty=torch.cat([k[3] for k in kept]),
        stats=stats,
    )


def lr_at(config: TrainerConfig, step: int) -> float:
    """Linear warm-up over `warmup_steps` rollout steps (step is 1-based), then constant."""
    w = config.optim.warmup_steps
    return config.optim.lr * (min(1.0, step / w) if w > 0 else 1.0)


# -------------------------------------------------------------------------------------- the loop
@dataclass
class Run:
    """Everything one training run holds between steps (built by `_setup`)."""

    config: TrainerConfig
    policy: Policy
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    engine: RolloutEngine
    verifier: Verifier
    task: Task
    eval_prompts: list[list[int]]
    settings: EvalSettings
    optimizer: torch.optim.Optimizer
    prompts: TrainingPrompts
    update_gen: torch.Generator
    result: RunResult


def train(
    config: TrainerConfig,
    out_dir: str | Path | None = None,
    *,
    callbacks: list[Callback] = (),
    resume: bool = True,
    eval_cache_dir: str | Path | None = None,
    engine_factory: Callable[[Policy, TrainerConfig], RolloutEngine] | None = None,
    seal_key: bytes | None = None,
) -> RunResult:
    """Train one configuration and return its RunResult (also written to out_dir/result.json).

    out_dir: where checkpoints and result.json go (None: keep nothing on disk).
    resume: continue from out_dir/checkpoint.pt when it was written by the same config.
    seal_key: the experiment's worker key (`seals.derive`): checkpoints and cached evaluations are
        sealed under it, and one that is not sealed for this run is ignored with a note to the
        callbacks ("note", step, {"message"}) and computed again. None (a direct call): sealed
        under the public `seals.UNKEYED`, and a checkpoint that is not is a ConfigError.
    eval_cache_dir: share step-0 evaluations between runs with the same policy and eval settings.
    engine_factory: build the rollout engine (default: HFRolloutEngine; vLLM for engine "vllm").

    Compute columns are fair across the runs of an ablation: `wall_s` counts the rollout steps and
    their evaluations only; the one-off shared work, loading (or first building) the policy and the
    step-0 evaluation (cached across runs), is in `setup_s` and `initial_eval_s`.
    Raises NonFiniteError when the loss or the gradient becomes NaN or infinite.
    """
    t_setup = time.perf_counter()
    run = _setup(config, engine_factory)
    run.result.setup_s = time.perf_counter() - t_setup
    ckpt = Path(out_dir) / "checkpoint.pt" if out_dir is not None else None
    if ckpt is not None and resume and os.path.lexists(ckpt):
        _resume(run, ckpt, seal_key, callbacks)
    if not run.result.eval:
        t0 = time.perf_counter()
        _evaluate(run, 0, callbacks, eval_cache_dir, seal_key or UNKEYED)
        run.result.initial_eval_s = time.perf_counter() - t0
    wall_before, started = run.result.wall_s, time.perf_counter()  # wall time before an interruption counts
    schedule = config.schedule
    for step in range(run.result.steps + 1, schedule.total_steps + 1):
        signals = _train_step(run, step)
        for cb in callbacks:
            cb("step", step, signals)
        if schedule.evaluates_after(step):
            _evaluate(run, step, callbacks, eval_cache_dir, seal_key or UNKEYED)
        run.result.wall_s = wall_before + time.perf_counter() - started
        if ckpt is not None and schedule.checkpoint_every and step % schedule.checkpoint_every == 0:
            _save_checkpoint(ckpt, run, seal_key or UNKEYED)
    run.result.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if out_dir is not None:
        run.result.save(Path(out_dir) / "result.json")
    return run.result


def _setup(config: TrainerConfig, engine_factory) -> Run:
    """Policy, engine, verifier, task, optimizer and seeded state of a fresh run."""
    pin_cpu_numerics()  # before the run's first tensor operation
    if config.model.threads > 0:
        torch.set_num_threads(config.model.threads)
    torch.manual_seed(config.schedule.seed)
    policy = load_policy(config.model, config.data.builtin_task)
    template = config.prompt_template
    policy.use_chat_template = config.model.use_chat_template and template != "none"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = policy.model.to(device)
    task = load_task(config)
    eval_prompts = [policy.encode_prompt(p) for p, _ in task.held_out]
    check_max_positions(config, model, eval_prompts + [policy.encode_prompt(p) for p, _ in task.train[:2048]])
    settings = EvalSettings(
        k=config.rollout.eval_k, temperature=config.rollout.eval_temperature, top_p=config.rollout.eval_top_p,
        max_new_tokens=config.rollout.max_response_len, seed=config.schedule.eval_seed,
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr_at(config, 1), betas=config.optim.betas, weight_decay=config.optim.weight_decay
    )
    result = RunResult(config=config.to_dict(), eval_problems=len(task.held_out), decontaminated=task.decontaminated)
    return Run(
        config=config, policy=policy, model=model,
        ref_model=copy.deepcopy(model).eval() if config.algorithm.kl_coef > 0 else None,
        engine=(engine_factory or default_engine)(policy, config), verifier=Verifier(method=config.verifier_method),
        task=task, eval_prompts=eval_prompts, settings=settings, optimizer=optimizer,
        prompts=TrainingPrompts(task.train, PromptSampler(size=len(task.train), seed=config.schedule.seed)),
        update_gen=torch.Generator().manual_seed(config.schedule.seed + 17), result=result,
    )


def check_max_positions(config: TrainerConfig, model: torch.nn.Module, prompts: list[list[int]]) -> None:
    """Refuse, in one sentence, a prompt + ceiling that does not fit the model's positions."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    longest = max((len(p) for p in prompts), default=0)
    if limit is not None and longest + config.rollout.max_response_len > limit:
        raise ConfigError(
            f"rollout.max_response_len {config.rollout.max_response_len} plus the longest prompt ({longest} tokens) "
            f"exceeds the model's max_position_embeddings ({limit}); lower max_response_len to at most {limit - longest}"
        )


def _resume(run: Run, ckpt: Path, seal_key: bytes | None, callbacks) -> None:
    """Continue from a step-boundary checkpoint written by the same config (else start afresh).

    The file is untrusted (a shared output folder): it is loaded only if it carries this product's
    seal for its content (`checkpoints.load_sealed`: a regular file, weights_only=True so no pickled
    code runs). One that does not (garbage, planted, copied from another run and edited, a link) is,
    in an experiment (`seal_key`), ignored with a note and the run trains from the start; in a direct
    call, a ConfigError naming the file. A sealed one that does not fit the model is a ConfigError."""
    def refuse(reason: str) -> ConfigError:
        return ConfigError(f"{ckpt} is not a checkpoint this trainer wrote for this run ({reason}); "
                           "delete it or pass --no-resume")

    try:
        state = load_sealed(ckpt, seal_key or UNKEYED)
    except UntrustedCheckpoint as why:
        if seal_key is None and why.config_digest not in (None, run.config.digest()):
            return  # a direct call: a checkpoint of another config is left for a fresh start, as before seals
        if seal_key is None:
            raise refuse(str(why)) from None
        _note(callbacks, 0, f"{ckpt} is not a checkpoint dapo-ablate sealed for this run ({why}); "
                            "it is ignored and the run trains from the start")
        return
    if state["config_digest"] != run.config.digest():
        return
    kinds = {"model": dict, "optimizer": dict, "sampler": dict, "update_gen": torch.Tensor, "result": dict}
    wrong = [key for key, kind in kinds.items() if not isinstance(state.get(key), kind)]
    if wrong:
        raise refuse(f"`{wrong[0]}` is missing or of the wrong type")
    try:
        run.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        run.prompts.sampler = PromptSampler(size=len(run.task.train), seed=run.config.schedule.seed, **state["sampler"])
        run.update_gen.set_state(state["update_gen"])
        result = RunResult.from_dict(state["result"])
    except (RuntimeError, KeyError, TypeError, ValueError) as err:
        raise refuse(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'its contents do not fit'}") from None
    result.setup_s += run.result.setup_s
    run.result = result
    run.engine.sync_weights(run.model)


def _evaluate(run: Run, step: int, callbacks, eval_cache_dir, seal_key: bytes) -> None:
    """Held-out avg/pass/maj@k at `step`; the step-0 one is shared through the cache, its entries
    sealed under `seal_key`."""
    t0 = time.perf_counter()
    config, policy = run.config, run.policy
    answers = [a for _, a in run.task.held_out]
    compute = lambda: evaluate(run.engine, run.eval_prompts, answers, policy.decode, run.verifier, run.settings, step)  # noqa: E731
    if step == 0:
        extra = {"verifier": config.verifier_method, "prompt_template": config.prompt_template, "cpu": numerics_tag()}
        key = initial_eval_key(_policy_identity(policy, config), run.task.held_out, run.settings, extra)
        metrics = cached_initial_eval(Path(eval_cache_dir) if eval_cache_dir else None, key, compute, seal_key,
                                      note=lambda message: _note(callbacks, 0, message))
    else:
        metrics = compute()
    metrics = {**metrics, "time_eval_s": time.perf_counter() - t0}
    run.result.eval_tokens += int(metrics.pop("tokens", 0))
    run.result.eval.append(metrics)
    for cb in callbacks:
        cb("eval", step, metrics)


def _train_step(run: Run, step: int) -> dict[str, float]:
    """Collect a batch, update the policy, sync the engine; returns the step's signals."""
    config, result = run.config, run.result
    lr = lr_at(config, step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    batch = collect_batch(config, run.engine, run.policy, run.verifier, run.prompts, step)
    signals: dict[str, float] = {"step": step, "lr": lr, **batch.stats}
    t0 = time.perf_counter()
    if batch.rollout is not None:
        try:
            signals.update(update_policy(config, run.model, run.ref_model, run.optimizer, batch,
                                         run.policy.pad_token_id, run.update_gen))
        except NonFiniteError as err:
            raise NonFiniteError(f"training diverged at step {step}: {err}") from None
        run.engine.sync_weights(run.model)
    else:  # dynamic sampling found no mixed group within max_gen_rounds: nothing to train on
        signals.update({"tokens_trained": 0.0, "updates": 0.0})
    signals["time_update_s"] = time.perf_counter() - t0
    result.signals.append(signals)
    result.tokens_generated += int(batch.stats["tokens_generated"])
    result.tokens_discarded += int(batch.stats["tokens_discarded"])
    result.tokens_trained += int(signals["tokens_trained"])
    result.steps = step
    return signals


def default_engine(policy: Policy, config: TrainerConfig) -> RolloutEngine:
    if config.rollout.engine == "vllm":
        return VLLMRolloutEngine(policy, config)
    return HFRolloutEngine(policy.model, policy.eos_token_ids, policy.pad_token_id, dtype=config.compute_dtype)


def _policy_identity(policy: Policy, config: TrainerConfig) -> str:
    device = next(policy.model.parameters()).device.type
    return f"{policy.source}|{config.model.dtype}|{config.model.use_chat_template}|{config.rollout.engine}|{device}"


def _save_checkpoint(path: Path, run: Run, key: bytes) -> None:
    """Write a step-boundary checkpoint atomically (a crash mid-write leaves the previous one),
    sealed under `key` (`checkpoints.save_sealed`). Tensors and plain data only, so it loads with
    weights_only=True."""
    state = {
        "config_digest": run.config.digest(),
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "sampler": run.prompts.sampler.state(),
        "update_gen": run.update_gen.get_state(),
        "result": run.result.to_dict(),
    }
    save_sealed(path, state, key)


def _note(callbacks, step: int, message: str) -> None:
    """Tell the callbacks (in an experiment: the driver's display) something the user should know."""
    logger.warning(message)
    for cb in callbacks:
        cb("note", step, {"message": message})
