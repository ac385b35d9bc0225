"""The math of GRPO and DAPO as pure functions on tensors.

No config objects, no I/O: each function takes tensors and numbers and returns tensors, so every
formula is tested against hand-computed numbers and a factorial ablation toggles one behaviour by
passing one argument. *Which* surrogate is computed (clipped ratio, dual clip) is separate from
*how* it is averaged (`aggregate_loss`: token-mean vs sample-mean), as in verl's core_algos.

Shapes: B responses, T response positions (right-padded), G = group size.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, valid: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO's group-normalised advantage.

    rewards: [num_groups, group_size] -> advantages of the same shape,
        A_i = (r_i - mean(r)) / (std(r) + eps), std unbiased (divides by N - 1).
    valid: optional bool mask of the same shape; when given, mean and std are computed over the valid
        entries of each group only (invalid entries get advantage 0). A group with fewer than two
        valid entries has std 0 and so advantages 0. A group whose rewards are all equal gets 0.
    """
    rewards = rewards.to(torch.float64)
    if valid is None:
        mean = rewards.mean(dim=-1, keepdim=True)
        std = rewards.std(dim=-1, keepdim=True, unbiased=True) if rewards.shape[-1] > 1 else torch.zeros_like(mean)
        return ((rewards - mean) / (std + eps)).to(torch.float32)
    w = valid.to(torch.float64)
    n = w.sum(dim=-1, keepdim=True)
    mean = (rewards * w).sum(dim=-1, keepdim=True) / n.clamp(min=1)
    var = (((rewards - mean) ** 2) * w).sum(dim=-1, keepdim=True) / (n - 1).clamp(min=1)
    std = torch.where(n > 1, var.sqrt(), torch.zeros_like(var))
    return (((rewards - mean) / (std + eps)) * w).to(torch.float32)


def soft_overlong_penalty(
    lengths: torch.Tensor, max_len: int, cache_len: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment (paper eq. 13), added to the task reward.

    lengths: [B] response lengths in tokens, the EOS token included.
    Returns [B] float:  0                                        if L <= max_len - cache_len
                        -factor * (L - (max_len - cache_len)) / cache_len   if that < L <= max_len
                        -factor                                  if L > max_len
    """
    start = max_len - cache_len
    lengths = lengths.to(torch.float32)
    ramp = -factor * (lengths - start) / cache_len
    penalty = torch.where(lengths <= start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_len, torch.full_like(lengths, -factor), penalty)


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, token_level: bool) -> torch.Tensor:
    """Average a per-token loss [B, T] over the valid tokens (mask [B, T], 0/1).

    token_level=True : sum of all valid token losses / number of valid tokens (DAPO's token-mean),
                       so every token weighs the same and long responses weigh more in total.
    token_level=False: mean over responses of each response's token mean (GRPO's sample-level
                       loss), so every response weighs the same whatever its length. Responses
                       with no valid token (all masked, e.g. overlong-filtered) are left out.
    The divisor is `loss_units(mask, token_level)` (at least 1).
    """
    mask = mask.to(per_token.dtype)
    if token_level:
        total = (per_token * mask).sum()
    else:
        tokens = mask.sum(dim=-1)
        seq_mean = (per_token * mask).sum(dim=-1) / tokens.clamp(min=1.0)
        total = (seq_mean * (tokens > 0).to(per_token.dtype)).sum()
    return total / loss_units(mask, token_level).clamp(min=1.0)


def loss_units(mask: torch.Tensor, token_level: bool) -> torch.Tensor:
    """What `aggregate_loss` averages over: mask [B, T] -> scalar count (a float tensor).

    token_level=True : the number of valid tokens;
    token_level=False: the number of responses with at least one valid token.
    """
    mask = mask if mask.is_floating_point() else mask.to(torch.float32)
    return mask.sum() if token_level else (mask.sum(dim=-1) > 0).to(mask.dtype).sum()


def micro_batch_weight(micro_mask: torch.Tensor, mini_mask: torch.Tensor, token_level: bool) -> float:
    """The weight of a micro-batch's `aggregate_loss` when a mini-batch is split into micro-batches.

    micro_mask: [b, T], the micro-batch's rows of mini_mask [B, T]. The weight is the micro-batch's
    share of the mini-batch's `loss_units` (tokens, or responses, that count), so the weighted
    micro-batch losses sum to the un-split mini-batch's aggregate_loss: token-mean divides by the
    mini-batch's token count, not by each micro-batch's.
    Example: token-level, micro-batches of 30 and 10 valid tokens in a 40-token mini-batch weigh
    0.75 and 0.25, and 0.75 * (S1 / 30) + 0.25 * (S2 / 10) = (S1 + S2) / 40.
    """
    return float(loss_units(micro_mask, token_level)) / float(loss_units(mini_mask, token_level).clamp(min=1.0))


def clipped_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    token_level: bool,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate with decoupled bounds (DAPO's Clip-Higher), averaged by `aggregate_loss`.

    log_probs, old_log_probs, mask: [B, T]; advantages: [B] (broadcast over tokens) or [B, T].
    Per token, with r = exp(log_probs - old_log_probs):
        pg_loss = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))
    and, with clip_ratio_c (dual clip, Ye et al. 2020), for A < 0: min(pg_loss, -A * clip_ratio_c).
    Returns (scalar loss, metrics) where metrics has
        clipfrac_low : share of valid tokens where the lower bound was active (A < 0, r < 1 - eps_low),
        clipfrac_high: share of valid tokens where the upper bound was active (A > 0, r > 1 + eps_high),
        clipfrac_dual: share where the dual clip was active, and approx_kl = mean(old - new log-prob).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_probs)
    log_ratio = (log_probs - old_log_probs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    pg_loss = torch.maximum(pg_loss1, pg_loss2)
    dual = torch.zeros_like(pg_loss, dtype=torch.bool)
    if clip_ratio_c is not None:
        pg_loss3 = -advantages * clip_ratio_c
        dual = (advantages < 0) & (pg_loss3 < pg_loss)
        pg_loss = torch.where(advantages < 0, torch.minimum(pg_loss, pg_loss3), pg_loss)
    loss = aggregate_loss(pg_loss, mask, token_level)

    with torch.no_grad():
        m = mask.to(torch.float32)
        n = m.sum().clamp(min=1.0)
        low = ((advantages < 0) & (ratio < 1.0 - eps_low)).float()
        high = ((advantages > 0) & (ratio > 1.0 + eps_high)).float()
        metrics = {
            "clipfrac_low": float((low * m).sum() / n),
            "clipfrac_high": float((high * m).sum() / n),
            "clipfrac_dual": float((dual.float() * m).sum() / n),
            "approx_kl": float((-log_ratio * m).sum() / n),
        }
    return loss, metrics


def keep_mixed_groups(correct: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic-sampling filter on raw correctness.

    correct: [num_groups, group_size] bool -> keep: [num_groups] bool,
    True where 0 < #correct < group_size (the group has a nonzero advantage signal).
    """
    n_correct = correct.to(torch.int64).sum(dim=-1)
    return (n_correct > 0) & (n_correct < correct.shape[-1])


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Schulman's low-variance KL estimator per token: exp(ref - logp) - (ref - logp) - 1 >= 0."""
    d = (ref_log_probs - log_probs).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution per position: logits [..., V] -> [...]. The reference
    formula; the training pass computes the same quantity chunk by chunk in core/logprobs.py
    (tests/unit/test_mixed_precision.py checks it against this one)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
