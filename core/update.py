"""The policy update of one rollout step: where each technique acts on rewards, advantages, the
loss mask and the loss, and the mini-batch loop (micro-batches, mixed precision, truncated
importance sampling, the rollout-vs-trainer log-prob gap, NaN/inf guard).

`dapo_ablate.core.trainer` re-exports these names; they are here so that the train loop and the
update each fit in one module of a few hundred lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import algorithms as alg
from . import logprobs
from .config import TrainerConfig
from .rollout import Rollout
from .verifier import extract_answer


class NonFiniteError(RuntimeError):
    """The loss or the gradient became NaN or infinite: the run ends with this reason."""


@dataclass
class StepBatch:
    """What one rollout step trains on (kept groups only), plus the step's bookkeeping."""

    rollout: Rollout | None
    rewards: torch.Tensor  # [groups, G]
    correct: torch.Tensor  # [groups, G] bool
    penalty: torch.Tensor  # [groups, G]
    stats: dict[str, float]


# ------------------------------------------------------------- where each technique acts (tested)
def shape_rewards(config: TrainerConfig, correct: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward = +1 / -1 by the verifier, plus the soft overlong penalty only with `soft_overlong`.

    correct [N] bool, lengths [N] (EOS included) -> (rewards [N], penalty [N]).
    """
    algo, roll = config.algorithm, config.rollout
    if config.techniques.soft_overlong:
        penalty = alg.soft_overlong_penalty(lengths, roll.max_response_len, algo.overlong_cache, algo.overlong_penalty_factor)
    else:
        penalty = torch.zeros(len(correct))
    return torch.where(correct, algo.reward_correct, algo.reward_wrong) + penalty, penalty


def flip_verdicts(correct: torch.Tensor, share: float, seed: int) -> torch.Tensor:
    """A noisy verifier: each verdict of `correct` [N] bool flipped independently with probability
    `share`, from a generator seeded with `seed` (the same seed flips the same verdicts)."""
    if share <= 0:
        return correct
    flips = torch.rand(len(correct), generator=torch.Generator().manual_seed(seed)) < share
    return correct ^ flips


def format_credit(config: TrainerConfig, texts: list[str], correct: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Partial credit [N]: algorithm.format_reward for each wrong, finished response whose final
    answer line is well formed (verifier.extract_answer finds one), else 0."""
    share = config.algorithm.format_reward
    if share <= 0:
        return torch.zeros(len(texts))
    formed = torch.tensor([extract_answer(t) is not None for t in texts], dtype=torch.bool)
    return torch.where(formed & ~correct & ~truncated, share, 0.0)


def compute_advantages(config: TrainerConfig, rewards: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Group-normalised advantages [groups, G]; with `overlong_filter` and filtered_in_group_stats
    off, truncated samples are left out of their group's mean and std."""
    algo = config.algorithm
    valid = ~truncated if (config.techniques.overlong_filter and not algo.filtered_in_group_stats) else None
    return alg.group_advantages(rewards, algo.advantage_eps, valid=valid)


def loss_mask(config: TrainerConfig, rollout: Rollout) -> torch.Tensor:
    """Per-token loss weights [N, T]: the response mask, with truncated responses zeroed only
    with `overlong_filter` (naive GRPO trains on them)."""
    mask = rollout.mask.clone()
    if config.techniques.overlong_filter:
        mask[rollout.truncated] = 0.0
    return mask


def policy_loss(config: TrainerConfig, log_probs, old_log_probs, advantages, mask):
    """The clipped surrogate with eps_high only under `clip_higher`, token-mean only under
    `token_level_loss` (else GRPO's sample-mean)."""
    algo = config.algorithm
    return alg.clipped_policy_loss(
        log_probs, old_log_probs, advantages, mask, algo.eps_low, config.eps_high_effective,
        token_level=config.techniques.token_level_loss, clip_ratio_c=algo.clip_ratio_c,
    )


# ------------------------------------------------------------------------------------ the update
def response_log_probs(
    model: torch.nn.Module, rollout: Rollout, rows: torch.Tensor, temperature: float, pad_id: int,
    settings: logprobs.LogProbSettings = logprobs.LogProbSettings(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [b, T] of the responses in `rows` at `temperature`, and token entropies [b, T]
    (memory-bounded and padding-free: see core/logprobs.py)."""
    return logprobs.response_log_probs(
        model, [rollout.prompt_ids[i] for i in rows.tolist()], rollout.responses[rows], rollout.mask[rows],
        temperature, pad_id, settings,
    )


def _log_probs_of(config: TrainerConfig, model, rollout: Rollout, rows: torch.Tensor, pad_id: int):
    """response_log_probs with the config's temperature, chunk and compute dtype."""
    settings = logprobs.LogProbSettings(chunk=config.batch.logprob_chunk, compute_dtype=config.compute_dtype)
    return response_log_probs(model, rollout, rows, config.rollout.temperature, pad_id, settings)


def importance_advantages(config: TrainerConfig, rollout: Rollout, advantages: torch.Tensor) -> torch.Tensor:
    """Advantages [N] -> [N, T] scaled per token by the truncated importance weight
    min(exp(trainer - engine log-prob), tis_cap) when `algorithm.tis_cap` is set (the engine's
    sampling distribution differs from the trainer's: vLLM, bf16). The weight is positive, so it
    scales the clipped surrogate's per-token term exactly; it carries no gradient."""
    cap = config.algorithm.tis_cap
    if cap is None or rollout.engine_log_probs is None:
        return advantages
    weight = torch.exp(rollout.log_probs - rollout.engine_log_probs).clamp(max=cap) * rollout.mask
    return advantages[:, None] * weight


def update_policy(
    config: TrainerConfig,
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    batch: StepBatch,
    pad_id: int,
    generator: torch.Generator,
) -> dict[str, float]:
    """Advantages, loss mask, then one AdamW update per shuffled mini-batch.

    The rollout-vs-trainer log-prob gap (`rollout_logprob_diff`, `_max`) is logged every step:
    over all tokens when the behaviour log-probs are recomputed (vLLM, bf16), else over the first
    mini-batch, whose forward runs before any update. Raises NonFiniteError on a NaN/inf loss or
    gradient norm (nothing is stepped with it).
    """
    rollout = batch.rollout
    assert rollout is not None
    advantages = compute_advantages(config, batch.rewards, rollout.truncated.view(batch.rewards.shape)).reshape(-1)
    mask = loss_mask(config, rollout)
    micro = config.batch.micro_batch_size or config.batch.mini_batch_size
    mismatch = {}
    if not rollout.log_probs_exact or config.compute_dtype != torch.float32:
        mismatch = recompute_behaviour_log_probs(config, model, rollout, micro, pad_id)
    advantages = importance_advantages(config, rollout, advantages)
    inputs = UpdateInputs(config, model, ref_model, rollout, mask, advantages, pad_id)
    N, mb = len(advantages), config.batch.mini_batch_size
    totals = {"clipfrac_low": 0.0, "clipfrac_high": 0.0, "approx_kl": 0.0, "entropy": 0.0, "kl": 0.0, "tokens": 0.0}
    gaps: list[torch.Tensor] = []
    grad_norms: list[float] = []
    model.train()
    for _ in range(config.batch.epochs):
        order = torch.randperm(N, generator=generator)
        for start in range(0, N, mb):
            mini = order[start : start + mb]
            if float(mask[mini].sum()) == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            for rows in logprobs.length_sorted_micro_batches(mini, rollout.lengths, micro):
                gap = _micro_step(inputs, rows, mini, totals)
                if not grad_norms and gap is not None:  # no update yet: the pure engine-vs-trainer gap
                    gaps.append(gap)
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip))
            if not math.isfinite(norm):
                raise NonFiniteError(f"the gradient norm is {norm} (lower optim.lr or use model.dtype float32)")
            grad_norms.append(norm)
            optimizer.step()
    count = max(totals.pop("tokens"), 1.0)
    out = {k: v / count for k, v in totals.items()}
    if not mismatch and gaps:
        gap = torch.cat(gaps)
        mismatch = {"rollout_logprob_diff": float(gap.mean()), "rollout_logprob_diff_max": float(gap.max())}
    out.update(grad_norm=sum(grad_norms) / max(len(grad_norms), 1), tokens_trained=float(mask.sum()),
               reward=float(batch.rewards.mean()), penalty=float(batch.penalty.mean()), updates=float(len(grad_norms)))
    return {**out, **mismatch}


@dataclass(frozen=True)
class UpdateInputs:
    """What every micro-step of one policy update reads (`update_policy` builds it once a step)."""

    config: TrainerConfig
    model: torch.nn.Module
    ref_model: torch.nn.Module | None  # the KL reference (None without a KL term)
    rollout: Rollout
    mask: torch.Tensor  # [N, T] per-token loss weights (`loss_mask`)
    advantages: torch.Tensor  # [N], or [N, T] with truncated importance weights
    pad_id: int


def _micro_step(
    inputs: UpdateInputs, rows: torch.Tensor, mini: torch.Tensor, totals: dict[str, float]
) -> torch.Tensor | None:
    """Forward/backward of the micro-batch `rows` of the mini-batch `mini`, weighted so the
    micro-batches sum to the mini-batch's average (`algorithms.micro_batch_weight`); adds its
    metrics to `totals`. Returns |trainer - behaviour| log-prob per valid token."""
    config, model, rollout, pad_id = inputs.config, inputs.model, inputs.rollout, inputs.pad_id
    token_level, algo = config.techniques.token_level_loss, config.algorithm
    m = inputs.mask[rows]
    if m.sum() == 0:
        return None
    logp, entropy = _log_probs_of(config, model, rollout, rows, pad_id)
    loss, metrics = policy_loss(config, logp, rollout.log_probs[rows], inputs.advantages[rows], m)
    if inputs.ref_model is not None and algo.kl_coef > 0:
        with torch.no_grad():
            ref_logp, _ = _log_probs_of(config, inputs.ref_model, rollout, rows, pad_id)
        kl = alg.aggregate_loss(alg.k3_kl(logp, ref_logp), m, token_level)
        loss = loss + algo.kl_coef * kl
        totals["kl"] += float(kl) * float(m.sum())
    if not torch.isfinite(loss):
        raise NonFiniteError(f"the loss is {float(loss.detach())} (lower optim.lr or use model.dtype float32)")
    (loss * alg.micro_batch_weight(m, inputs.mask[mini], token_level)).backward()
    n_tok = float(m.sum())
    totals["tokens"] += n_tok
    for key in ("clipfrac_low", "clipfrac_high", "approx_kl"):
        totals[key] += metrics[key] * n_tok
    totals["entropy"] += float((entropy * m).sum())
    return (logp.detach() - rollout.log_probs[rows]).abs()[rollout.mask[rows].bool()]


@torch.no_grad()
def recompute_behaviour_log_probs(config: TrainerConfig, model, rollout: Rollout, micro: int, pad_id: int) -> dict[str, float]:
    """Replace an engine's log-probs with the training model's own (before any update this step),
    keeping the engine's in `rollout.engine_log_probs`; returns the per-token gap between them
    (`rollout_logprob_diff`, `rollout_logprob_diff_max`: |trainer - engine| over response tokens)."""
    model.eval()
    rollout.engine_log_probs = rollout.log_probs.clone()
    for rows in logprobs.length_sorted_micro_batches(torch.arange(len(rollout.prompt_ids)), rollout.lengths, micro):
        logp, _ = _log_probs_of(config, model, rollout, rows, pad_id)
        rollout.log_probs[rows] = logp * rollout.mask[rows]
    rollout.log_probs_exact = True
    gap = (rollout.log_probs - rollout.engine_log_probs).abs()[rollout.mask.bool()]
    if gap.numel() == 0:
        return {}
    return {"rollout_logprob_diff": float(gap.mean()), "rollout_logprob_diff_max": float(gap.max())}


