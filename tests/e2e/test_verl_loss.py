"""Overlong Filtering's loss for verl equals the built-in trainer's, on the same tensors.

`overlong_filtered_policy_loss` (registered in verl as ``dapo_overlong_filter``) must equal
``dapo_ablate.core.algorithms.clipped_policy_loss`` with the truncated rows masked, to 1e-6, for
both aggregations and with and without the dual clip. It is plain torch, so this runs here without
verl; verl's registry hook and verl's own V1 loss path are tested in the verl environment
(tests/e2e/test_verl_v1_loss.py).
"""

from __future__ import annotations

import pytest
import torch

from dapo_ablate.ablation.runtime.backends.verl import NO_DUAL_CLIP
from dapo_ablate.ablation.runtime.backends.verl_loss import (
    MAX_RESPONSE_LEN_ENV,
    LossSettings,
    loss_units_masks,
    overlong_filtered_policy_loss,
    register,
    truncated_rows,
    verl_policy_loss,
)
from dapo_ablate.core.algorithms import clipped_policy_loss


B, T = 12, 16


class ActorConfig(dict):
    """The fields verl's ActorConfig gives a policy loss (a dict with attribute access, like verl's BaseConfig)."""

    __getattr__ = dict.__getitem__


def batch(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T, (B,), generator=generator)
    lengths[[1, 4, 7, 10]] = T  # four responses cut at the ceiling
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    old = -torch.rand(B, T, generator=generator, dtype=torch.float64) * 3
    new = old + torch.randn(B, T, generator=generator, dtype=torch.float64) * 0.4  # ratios well past the clip bounds
    advantages = torch.randn(B, generator=generator, dtype=torch.float64)
    return {"old": old, "new": new, "mask": mask, "adv": advantages}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("token_level", [True, False])
@pytest.mark.parametrize("clip_ratio_c", [None, 3.0])
def test_equals_the_builtin_clipped_loss_with_truncated_rows_masked(seed: int, token_level: bool, clip_ratio_c: float | None):
    b = batch(seed)
    truncated = truncated_rows(b["mask"], T)
    assert truncated.tolist() == [i in (1, 4, 7, 10) for i in range(B)]
    expected, _ = clipped_policy_loss(
        b["new"], b["old"], b["adv"], b["mask"] * (~truncated).unsqueeze(-1), eps_low=0.2, eps_high=0.28,
        token_level=token_level, clip_ratio_c=clip_ratio_c,
    )
    got, metrics = overlong_filtered_policy_loss(
        b["old"], b["new"], b["adv"].unsqueeze(-1).expand(B, T), b["mask"],
        LossSettings(0.2, 0.28, T, clip_ratio_c=clip_ratio_c if clip_ratio_c is not None else NO_DUAL_CLIP,
                     loss_agg_mode="token-mean" if token_level else "seq-mean-token-mean"),
    )
    assert abs(float(got) - float(expected)) < 1e-6
    assert metrics["actor/overlong_filtered_frac"] == pytest.approx(4 / B)
    # and filtering matters: the unfiltered loss differs
    unfiltered, _ = clipped_policy_loss(b["new"], b["old"], b["adv"], b["mask"], 0.2, 0.28, token_level, clip_ratio_c)
    assert abs(float(unfiltered) - float(expected)) > 1e-4


def units_count(mask: torch.Tensor, mode: str) -> int:
    """What verl's engine counts for a mini-batch once the trainer mode has rewritten loss_mask:
    the sum of `loss_units_masks` over its responses (batch_num_tokens)."""
    return int(sum(m.sum() for m in loss_units_masks(list(mask.unbind()), T, mode)))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_loss_units_masks_count_the_kept_tokens_or_the_kept_responses(mode: str):
    b = batch(4)
    kept = b["mask"] * (~truncated_rows(b["mask"], T)).unsqueeze(-1)
    expected = int(kept.sum()) if mode == "token-mean" else int(((kept.sum(-1) > 0)).sum())
    assert units_count(b["mask"], mode) == expected
    # a padding row of verl's (no valid token) counts for nothing either way, a truncated row neither
    empty, cut = torch.zeros(T), torch.ones(T)
    assert [int(m.sum()) for m in loss_units_masks([empty, cut], T, mode)] == [0, 0]
    with pytest.raises(ValueError, match="loss_agg_mode 'token-sum'"):
        loss_units_masks([cut], T, "token-sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("split", [[4, 8], [1, 3, 8], [2, 10]])
def test_verls_entry_point_with_its_global_count_is_exact_for_any_micro_batches(mode: str, split: list[int], monkeypatch):
    """Through the registered signature, one rank, the batch cut into micro-batches whose kept shares
    differ (four truncated rows at 1, 4, 7, 10): with verl's count of the rewritten loss_mask, the
    micro-batch losses add up to the filtered loss of the whole batch. (The share-scaled count of
    the previous version was off here whenever the kept shares differed.)"""
    monkeypatch.setenv(MAX_RESPONSE_LEN_ENV, str(T))
    b = batch(3)
    adv = b["adv"].unsqueeze(-1).expand(B, T)
    full, _ = overlong_filtered_policy_loss(b["old"], b["new"], adv, b["mask"],
                                            LossSettings(0.2, 0.28, T, clip_ratio_c=3.0, loss_agg_mode=mode))
    info = {"dp_size": 1, "batch_num_tokens": units_count(b["mask"], mode), "global_batch_size": B}
    config = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, global_batch_info=info)
    total = 0.0
    for h in torch.tensor_split(torch.arange(B), split):
        loss, _ = verl_policy_loss(b["old"][h], b["new"][h], adv[h], b["mask"][h], mode, config)
        total += float(loss)
    assert abs(total - float(full)) < 1e-9


def test_rollout_importance_weights_are_refused(monkeypatch):
    monkeypatch.setenv(MAX_RESPONSE_LEN_ENV, str(T))
    b = batch(0)
    config = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, global_batch_info={})
    with pytest.raises(ValueError, match="tis_cap"):
        verl_policy_loss(b["old"], b["new"], b["adv"].unsqueeze(-1).expand(B, T), b["mask"], "token-mean", config, torch.ones(B, T))


def test_registration_without_verl_is_a_no_op():
    try:
        import verl  # noqa: F401
    except ImportError:
        assert register() is False
    else:  # where verl is installed, the loss is in its registry under the name the overrides use
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        assert register() is True and get_policy_loss_fn("dapo_overlong_filter") is verl_policy_loss
