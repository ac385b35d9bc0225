"""Overlong Filtering for verl, through verl's own policy-loss registry (verl has none of its own).

verl imports this module when a job's environment has
``VERL_USE_EXTERNAL_MODULES=dapo_ablate.ablation.runtime.backends.verl_loss`` (the verl backend sets it),
which registers the loss ``dapo_overlong_filter``; the cell's overrides select it with
``actor_rollout_ref.actor.policy_loss.loss_mode=dapo_overlong_filter``. Without verl installed the
module still imports, so the loss itself (`overlong_filtered_policy_loss`, plain torch) is tested
against ``dapo_ablate.core.algorithms.clipped_policy_loss`` here.

The loss is verl's ``vanilla`` clipped surrogate (decoupled bounds, dual clip, ratio clamp) with the
truncated responses taken out of the token mask *and* of the denominator:

- truncated = a response whose length (its mask's sum) reaches the response ceiling,
  ``rollout.max_response_len``, which the job's environment gives as ``DAPO_ABLATE_MAX_RESPONSE_LEN``
  (verl's own ``response_length/clip_ratio`` counts the same responses). Never the tensor's width:
  verl's V1 trainer keeps responses unpadded and pads each micro-batch only to its own longest
  response, so the longest response of every micro-batch fills the width without being cut. A
  response that ends with EOS exactly on the ceiling's last token counts as truncated, as in verl.
- ``token-mean``: sum over kept tokens / number of kept tokens; ``seq-mean-token-mean``: mean over
  kept responses of their token means.

Across GPUs and micro-batches verl divides by the mini-batch's global token (or sequence) count,
truncated ones included; that count is scaled by this micro-batch's kept share (exact with one
micro-batch per mini-batch on one data-parallel rank, an estimate otherwise).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

LOSS_NAME = "dapo_overlong_filter"
MAX_RESPONSE_LEN_ENV = "DAPO_ABLATE_MAX_RESPONSE_LEN"  # backends.verl.MAX_RESPONSE_LEN_ENV (this module imports no other)


def truncated_rows(response_mask: torch.Tensor, max_response_length: int) -> torch.Tensor:
    """[B] bool: responses whose length (mask sum) reaches `max_response_length`."""
    return response_mask.sum(dim=-1) >= max_response_length


def response_ceiling() -> int:
    """The cell's ``rollout.max_response_len``, from the job's environment."""
    value = os.environ.get(MAX_RESPONSE_LEN_ENV, "")
    if not value.isdigit():
        raise RuntimeError(f"{LOSS_NAME} needs the response ceiling in ${MAX_RESPONSE_LEN_ENV} (got {value!r}); "
                           "the verl backend sets it in every job's environment")
    return int(value)


def _clipped_per_token(old_log_prob, log_prob, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c):
    """verl's vanilla per-token loss (ratio clamp, decoupled clip, dual clip for A < 0)."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_ratio_c
    per_token = torch.where(advantages < 0, torch.minimum(loss3, clipped), clipped)
    return per_token, negative_approx_kl, loss1, loss2, clipped, loss3


@dataclass(frozen=True)
class LossSettings:
    """The loss's settings, as verl's actor config gives them (`verl_policy_loss`)."""

    clip_ratio_low: float
    clip_ratio_high: float
    max_response_length: int
    """Responses this long were truncated: they are left out of the loss and its denominator."""
    clip_ratio_c: float = 1e9
    """Dual-clip bound for negative advantages (1e9: no dual clip)."""
    loss_agg_mode: str = "token-mean"
    denominator: float | None = None
    """Kept tokens (token-mean) or kept responses (seq-mean-token-mean); None: this batch's."""


def overlong_filtered_policy_loss(
    old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
    settings: LossSettings,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy loss over responses shorter than ``settings.max_response_length``.
    Tensors [B, T] (T may be below the ceiling)."""
    clip_ratio_low, clip_ratio_high, clip_ratio_c = settings.clip_ratio_low, settings.clip_ratio_high, settings.clip_ratio_c
    max_response_length, loss_agg_mode, denominator = settings.max_response_length, settings.loss_agg_mode, settings.denominator
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_prob)
    truncated = truncated_rows(response_mask, max_response_length)
    keep = (~truncated).unsqueeze(-1) & response_mask.bool()
    mask = keep.to(log_prob.dtype)
    per_token, neg_kl, loss1, loss2, clipped, loss3 = _clipped_per_token(
        old_log_prob, log_prob, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    if loss_agg_mode == "token-mean":
        total = mask.sum() if denominator is None else torch.as_tensor(denominator, dtype=mask.dtype)
        loss = (per_token * mask).sum() / total.clamp(min=1.0)
    elif loss_agg_mode == "seq-mean-token-mean":
        tokens = mask.sum(dim=-1)
        seq_mean = (per_token * mask).sum(dim=-1) / tokens.clamp(min=1.0)
        has = (tokens > 0).to(mask.dtype)
        total = has.sum() if denominator is None else torch.as_tensor(denominator, dtype=mask.dtype)
        loss = (seq_mean * has).sum() / total.clamp(min=1.0)
    else:
        raise ValueError(f"loss_agg_mode {loss_agg_mode!r} is not supported by {LOSS_NAME}; use token-mean or seq-mean-token-mean")
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        metrics = {
            "actor/pg_clipfrac": float((torch.gt(loss2, loss1).to(mask.dtype) * mask).sum() / n),
            "actor/ppo_kl": float((-neg_kl * mask).sum() / n),
            "actor/pg_clipfrac_lower": float((torch.gt(clipped, loss3) * (advantages < 0)).to(mask.dtype).mul(mask).sum() / n),
            "actor/overlong_filtered_frac": float(truncated.float().mean()),
        }
    return loss, metrics


def _global_denominator(response_mask: torch.Tensor, keep_rows: torch.Tensor, mode: str, info: dict[str, Any]) -> float | None:
    """verl's global count (all GPUs, all micro-batches) scaled by this micro-batch's kept share,
    times dp_size as verl's agg_loss does; None when verl gives no global count."""
    dp_size = info.get("dp_size", 1) or 1
    if mode == "token-mean" and info.get("batch_num_tokens"):
        kept = float((response_mask * keep_rows.unsqueeze(-1)).sum())
        share = kept / max(float(response_mask.sum()), 1.0)
        return float(info["batch_num_tokens"]) * share / dp_size
    if mode == "seq-mean-token-mean" and info.get("global_batch_size"):
        share = float(keep_rows.sum()) / max(float((response_mask.sum(-1) > 0).sum()), 1.0)
        return float(info["global_batch_size"]) * share / dp_size
    return None


def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """The function registered in verl (its PolicyLossFn signature)."""
    if rollout_is_weights is not None:
        raise ValueError(f"{LOSS_NAME} does not take rollout importance weights; leave algorithm.tis_cap unset")
    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    ceiling = response_ceiling()
    keep_rows = ~truncated_rows(response_mask, ceiling)
    info = dict(getattr(config, "global_batch_info", None) or {})
    settings = LossSettings(low, high, ceiling, clip_ratio_c=config.get("clip_ratio_c", 3.0), loss_agg_mode=loss_agg_mode,
                            denominator=_global_denominator(response_mask, keep_rows, loss_agg_mode, info))
    return overlong_filtered_policy_loss(old_log_prob, log_prob, advantages, response_mask, settings)


def register() -> bool:
    """Register the loss in verl's registry; False when verl is not installed here."""
    try:
        from verl.trainer.ppo.core_algos import register_policy_loss
    except ImportError:
        return False
    register_policy_loss(LOSS_NAME)(verl_policy_loss)
    return True


register()
