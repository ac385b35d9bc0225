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

Across GPUs and micro-batches the loss divides by one global count, as verl's own ``agg_loss`` does:
verl's V1 engine sums each mini-batch's ``loss_mask`` over every data-parallel rank *before* it splits
the mini-batch into micro-batches (``batch_num_tokens``, fsdp/transformer_impl.py), and hands every
micro-batch's loss that sum. verl keeps ``loss_mask`` as a copy of ``response_mask`` and reads it for
nothing else in the PPO update, so ``verl_trainer`` (the V1 trainer mode the translation pairs with
this loss) rewrites it before each actor update to the loss's units (`loss_units_masks`): the kept
tokens (token-mean), or one marked token per kept response (seq-mean-token-mean). verl's count is
then the number of kept tokens (or kept responses) in the whole mini-batch, and the loss is its exact
global mean under any micro-batching, dynamic or fixed, on any number of ranks: each kept token (or
response) weighs 1 / that count wherever it lands, a truncated one 0.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

LOSS_NAME = "dapo_overlong_filter"
MAX_RESPONSE_LEN_ENV = "DAPO_ABLATE_MAX_RESPONSE_LEN"  # backends.verl.MAX_RESPONSE_LEN_ENV (this module imports no other)
AGGREGATIONS = ("token-mean", "seq-mean-token-mean")


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
    """Kept tokens (token-mean) or kept responses (seq-mean-token-mean) over dp_size, counted over the
    whole mini-batch on every rank (`loss_units_masks`); None: this batch's own count."""


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, denominator: float | None) -> torch.Tensor:
    """Sum of the kept tokens' losses (token-mean) or of the kept responses' token means
    (seq-mean-token-mean) over `denominator`, the global count of those units (None: this batch's own
    count). A global count of 0 means nothing is kept anywhere: the loss is 0."""
    if mode == "token-mean":
        total, units = (per_token * mask).sum(), mask.sum()
    elif mode == "seq-mean-token-mean":
        tokens = mask.sum(dim=-1)
        has = (tokens > 0).to(mask.dtype)
        total, units = ((per_token * mask).sum(dim=-1) / tokens.clamp(min=1.0) * has).sum(), has.sum()
    else:
        raise ValueError(f"loss_agg_mode {mode!r} is not supported by {LOSS_NAME}; use token-mean or seq-mean-token-mean")
    if denominator is None:
        return total / units.clamp(min=1.0)
    return total / denominator if denominator > 0 else total * 0.0


def overlong_filtered_policy_loss(
    old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
    settings: LossSettings,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy loss over responses shorter than ``settings.max_response_length``.
    Tensors [B, T] (T may be below the ceiling)."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_prob)
    truncated = truncated_rows(response_mask, settings.max_response_length)
    mask = ((~truncated).unsqueeze(-1) & response_mask.bool()).to(log_prob.dtype)
    per_token, neg_kl, loss1, loss2, clipped, loss3 = _clipped_per_token(
        old_log_prob, log_prob, advantages, settings.clip_ratio_low, settings.clip_ratio_high, settings.clip_ratio_c
    )
    loss = _aggregate(per_token, mask, settings.loss_agg_mode, settings.denominator)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        metrics = {
            "actor/pg_clipfrac": float((torch.gt(loss2, loss1).to(mask.dtype) * mask).sum() / n),
            "actor/ppo_kl": float((-neg_kl * mask).sum() / n),
            "actor/pg_clipfrac_lower": float((torch.gt(clipped, loss3) * (advantages < 0)).to(mask.dtype).mul(mask).sum() / n),
            "actor/overlong_filtered_frac": float(truncated.float().mean()),
        }
    return loss, metrics


def loss_units_masks(response_masks: list[torch.Tensor], max_response_length: int, loss_agg_mode: str) -> list[torch.Tensor]:
    """The ``loss_mask`` of each response [T_i] (jagged: one tensor per response, as verl's V1 keeps
    them) whose sum over a mini-batch is the loss's global divisor: token-mean, the response's mask,
    zeroed when truncated; seq-mean-token-mean, a single 1 on the first token of a kept response with
    any valid token (``core.algorithms.loss_units``: responses with no valid token, such as verl's
    padding rows, count for nothing). Same dtype and length as each response mask."""
    if loss_agg_mode not in AGGREGATIONS:
        raise ValueError(f"loss_agg_mode {loss_agg_mode!r} is not supported by {LOSS_NAME}; use token-mean or seq-mean-token-mean")
    units = []
    for mask in response_masks:
        kept = mask * 0 if int(mask.sum()) >= max_response_length else mask
        if loss_agg_mode == "seq-mean-token-mean":
            marker = torch.zeros_like(mask)
            if int(kept.sum()) > 0:
                marker[int(kept.nonzero()[0])] = 1
            kept = marker
        units.append(kept)
    return units


def _global_denominator(info: dict[str, Any]) -> float | None:
    """verl's global count of the loss's units (``batch_num_tokens``: the mini-batch's
    `loss_units_masks` summed over every rank) over dp_size, as verl's agg_loss divides (each rank's
    loss is multiplied by dp_size, then the ranks' gradients averaged); None without that count
    (one micro-batch on one rank: this batch's own count is exact)."""
    if info.get("batch_num_tokens") is None:
        return None
    return float(info["batch_num_tokens"]) / (info.get("dp_size", 1) or 1)


def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """The function registered in verl (its PolicyLossFn signature)."""
    if rollout_is_weights is not None:
        raise ValueError(f"{LOSS_NAME} does not take rollout importance weights; leave algorithm.tis_cap unset")
    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    info = dict(getattr(config, "global_batch_info", None) or {})
    settings = LossSettings(low, high, response_ceiling(), clip_ratio_c=config.get("clip_ratio_c", 3.0),
                            loss_agg_mode=loss_agg_mode, denominator=_global_denominator(info))
    return overlong_filtered_policy_loss(old_log_prob, log_prob, advantages, response_mask, settings)


TRAINER_MODULE = "dapo_ablate.ablation.runtime.backends.verl_trainer"
ISOLATION_MODULE = "dapo_ablate.ablation.runtime.backends.verl_isolation"
V1_PACKAGE = "verl.trainer.ppo.v1"


class _AfterV1Import(importlib.abc.MetaPathFinder):
    """Imports `TRAINER_MODULE` (which registers the trainer mode) right after verl's V1 trainer
    package is imported. Not before: that package pulls in TransferQueue and verl's agent, reward and
    teacher loops (about as long again as ``import verl``), which only the process that builds the
    trainer needs, while every verl process imports this module."""

    def find_spec(self, fullname, path, target=None):
        if fullname != V1_PACKAGE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            importlib.import_module(TRAINER_MODULE)

        spec.loader.exec_module = exec_then_register
        return spec


def register_trainer_on_import() -> None:
    """Register the trainer mode now if verl's V1 package is already imported, else once it is."""
    if V1_PACKAGE in sys.modules:
        importlib.import_module(TRAINER_MODULE)
    elif not any(isinstance(finder, _AfterV1Import) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterV1Import())


def register() -> bool:
    """Register the loss in verl's registry, and the trainer mode that counts its units (on import of
    verl's V1 package); give this process's TransferQueue the job's own Ray namespace
    (`verl_isolation`: verl imports this module in every process of a job). False when verl is not
    installed here."""
    try:
        from verl.trainer.ppo.core_algos import register_policy_loss
    except ImportError:
        return False
    register_policy_loss(LOSS_NAME)(verl_policy_loss)
    register_trainer_on_import()
    importlib.import_module(ISOLATION_MODULE).isolate_transfer_queue()
    return True


register()
