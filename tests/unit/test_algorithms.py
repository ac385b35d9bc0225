"""The math API against hand-computed numbers (each worked out in a comment)."""

import math

import pytest
import torch

from dapo_ablate.core.algorithms import (
    aggregate_loss,
    clipped_policy_loss,
    group_advantages,
    k3_kl,
    keep_mixed_groups,
    loss_units,
    micro_batch_weight,
    soft_overlong_penalty,
)


def test_group_advantages_hand_computed():
    # group [1, -1, -1, 1]: mean 0, unbiased std = sqrt((1+1+1+1)/3) = 1.1547 -> A = +-0.8660
    # group [1, 1, 1, -1]: mean 0.5, deviations .5 .5 .5 -1.5, var = (3*.25 + 2.25)/3 = 1, std 1
    rewards = torch.tensor([[1.0, -1.0, -1.0, 1.0], [1.0, 1.0, 1.0, -1.0]])
    adv = group_advantages(rewards, eps=0.0)
    s = 1 / math.sqrt(4 / 3)
    assert torch.allclose(adv[0], torch.tensor([s, -s, -s, s]), atol=1e-6)
    assert torch.allclose(adv[1], torch.tensor([0.5, 0.5, 0.5, -1.5]), atol=1e-6)


def test_group_advantages_all_equal_is_zero():
    # std 0: (r - mean) = 0 so A = 0 / eps = 0, no NaN
    adv = group_advantages(torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]))
    assert torch.equal(adv, torch.zeros(2, 3))


def test_group_advantages_valid_mask_excludes_entries():
    # valid entries [1, -1] (third excluded): mean 0, std sqrt(2/1) = 1.414 -> +-0.7071; excluded -> 0
    rewards = torch.tensor([[1.0, -1.0, -1.0]])
    valid = torch.tensor([[True, True, False]])
    adv = group_advantages(rewards, eps=0.0, valid=valid)
    assert torch.allclose(adv, torch.tensor([[1 / math.sqrt(2), -1 / math.sqrt(2), 0.0]]), atol=1e-6)


def test_soft_overlong_penalty_hand_computed():
    # max_len 20, cache 4: start 16. L=16 -> 0; L=17 -> -1/4; L=18 -> -2/4; L=20 -> -1; L=25 -> -1
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    got = soft_overlong_penalty(lengths, max_len=20, cache_len=4, factor=1.0)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    # factor scales the whole ramp: L=18 with factor 2 -> -2 * 2/4 = -1
    assert float(soft_overlong_penalty(torch.tensor([18]), 20, 4, factor=2.0)) == -1.0


def test_paper_scale_penalty_starts_at_16384():
    got = soft_overlong_penalty(torch.tensor([16384, 16385, 20480]), max_len=20480, cache_len=4096)
    assert got[0] == 0.0 and got[1] == pytest.approx(-1 / 4096) and got[2] == -1.0


def test_clipped_loss_hand_computed_token_level():
    # one sequence, two tokens, A = +1; ratios e^0.5=1.6487 (clipped at 1.28) and e^-0.5=0.6065 (A>0: min side)
    # per token: max(-A r, -A clip(r)) = max(-1.6487, -1.28) = -1.28 ; max(-0.6065, -0.8) = -0.6065
    lp = torch.tensor([[0.5, -0.5]])
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    loss, m = clipped_policy_loss(lp, old, torch.tensor([1.0]), mask, 0.2, 0.28, token_level=True)
    assert float(loss) == pytest.approx((-1.28 - math.exp(-0.5)) / 2, abs=1e-6)
    assert m["clipfrac_high"] == 0.5 and m["clipfrac_low"] == 0.0


def test_clipped_loss_low_bound_for_negative_advantage():
    # A = -1, r = e^-0.5 = 0.6065 < 0.8: max(0.6065, 0.8) = 0.8 (clipped, no gradient)
    loss, m = clipped_policy_loss(torch.tensor([[-0.5]]), torch.zeros(1, 1), torch.tensor([-1.0]),
                                  torch.ones(1, 1), 0.2, 0.28, token_level=True)
    assert float(loss) == pytest.approx(0.8) and m["clipfrac_low"] == 1.0 and m["clipfrac_high"] == 0.0


def test_upper_bound_moves_with_eps_high():
    # r = 1.25, A = +1: clipped at 1.2 with eps_high 0.2 (loss -1.2), unclipped with 0.28 (loss -1.25)
    lp = torch.tensor([[math.log(1.25)]])
    args = (lp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), 0.2)
    sym, m_sym = clipped_policy_loss(*args, eps_high=0.2, token_level=True)
    high, m_high = clipped_policy_loss(*args, eps_high=0.28, token_level=True)
    assert float(sym) == pytest.approx(-1.2) and m_sym["clipfrac_high"] == 1.0
    assert float(high) == pytest.approx(-1.25) and m_high["clipfrac_high"] == 0.0


def test_dual_clip_bounds_negative_advantage_loss():
    # A = -1, r = e^2 = 7.39: pg = max(7.39, 1.28) = 7.39; dual clip c=3 -> min(7.39, 3) = 3
    args = (torch.tensor([[2.0]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.28, True)
    loss, m = clipped_policy_loss(*args, clip_ratio_c=3.0)
    assert float(loss) == pytest.approx(3.0) and m["clipfrac_dual"] == 1.0
    assert float(clipped_policy_loss(*args)[0]) == pytest.approx(math.exp(2.0))
    # for A > 0 the dual clip never acts: r = e^2 clipped at 1.28 -> loss -1.28 with or without it
    pos = (torch.tensor([[2.0]]), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.28, True)
    loss, m = clipped_policy_loss(*pos, clip_ratio_c=3.0)
    assert float(loss) == pytest.approx(-1.28) and m["clipfrac_dual"] == 0.0


def test_token_vs_sample_level_aggregation_hand_computed():
    # seq 1: 3 tokens of loss 1; seq 2: 1 token of loss 4 (mask hides the rest)
    # token-mean: (1+1+1+4)/4 = 1.75 ; sample-mean: (1 + 4)/2 = 2.5
    per_token = torch.tensor([[1.0, 1.0, 1.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(aggregate_loss(per_token, mask, token_level=True)) == pytest.approx(1.75)
    assert float(aggregate_loss(per_token, mask, token_level=False)) == pytest.approx(2.5)


def test_sample_level_skips_fully_masked_rows():
    # row 2 is all masked (an overlong-filtered sample): sample-mean is row 1's mean, 2.0, not 1.0
    per_token = torch.tensor([[2.0, 2.0], [5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert float(aggregate_loss(per_token, mask, token_level=False)) == pytest.approx(2.0)


def test_advantages_shaped_b_and_bt_agree():
    torch.manual_seed(0)
    lp, old = torch.randn(3, 5) * 0.1, torch.randn(3, 5) * 0.1
    mask = (torch.rand(3, 5) > 0.3).float()
    adv = torch.tensor([0.5, -1.0, 2.0])
    a, _ = clipped_policy_loss(lp, old, adv, mask, 0.2, 0.28, token_level=False)
    b, _ = clipped_policy_loss(lp, old, adv[:, None].expand(3, 5), mask, 0.2, 0.28, token_level=False)
    assert torch.allclose(a, b)


@pytest.mark.parametrize("token_level", [True, False])
def test_micro_batch_split_equals_unsplit_mini_batch(token_level):
    """Gradient accumulated over micro-batches, each weighted as the trainer does, equals the
    gradient of the un-split mini-batch average (token-mean divides by the mini-batch's tokens)."""
    torch.manual_seed(0)
    B, T = 8, 6
    theta = torch.randn(B, T, requires_grad=True)
    old = torch.randn(B, T) * 0.1
    adv = torch.randn(B)
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 4, 1])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()

    full, _ = clipped_policy_loss(theta * 0.1, old, adv, mask, 0.2, 0.28, token_level)
    (g_full,) = torch.autograd.grad(full, theta)

    total_tokens, total_seqs = mask.sum(), (mask.sum(-1) > 0).sum()
    g_split = torch.zeros_like(theta)
    for rows in (torch.tensor([0, 1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6, 7])):
        m = mask[rows]
        loss, _ = clipped_policy_loss(theta[rows] * 0.1, old[rows], adv[rows], m, 0.2, 0.28, token_level)
        weight = m.sum() / total_tokens if token_level else (m.sum(-1) > 0).sum() / total_seqs
        (g,) = torch.autograd.grad(loss * weight, theta)
        g_split += g
    assert torch.allclose(g_full, g_split, atol=1e-6)


def test_loss_units_hand_computed():
    # rows with 3, 0 and 2 valid tokens: 5 tokens; 2 responses that have a token
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    assert float(loss_units(mask, token_level=True)) == 5.0
    assert float(loss_units(mask, token_level=False)) == 2.0
    assert float(loss_units(mask.bool(), token_level=False)) == 2.0
    assert float(loss_units(torch.zeros(2, 3), token_level=True)) == 0.0


def test_micro_batch_weight_hand_computed():
    # mini-batch rows with 3, 0, 2, 1 valid tokens: 6 tokens, 3 responses that count.
    # Micro-batch rows {0, 1}: 3 tokens, 1 response -> 3/6 token-level, 1/3 sample-level.
    mask = (torch.arange(3)[None, :] < torch.tensor([3, 0, 2, 1])[:, None]).float()
    assert micro_batch_weight(mask[:2], mask, token_level=True) == pytest.approx(0.5)
    assert micro_batch_weight(mask[:2], mask, token_level=False) == pytest.approx(1 / 3)
    assert micro_batch_weight(mask[1:2], mask, token_level=True) == 0.0  # no valid token: no weight


@pytest.mark.parametrize("token_level", [True, False])
def test_weighted_micro_batch_losses_sum_to_the_mini_batch_loss(token_level):
    """sum over micro-batches of micro_batch_weight * aggregate_loss == the un-split aggregate_loss,
    for any grouping (a fully masked row included)."""
    torch.manual_seed(1)
    per_token = torch.randn(8, 6, dtype=torch.float64)
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 0, 3, 6, 2, 5, 4, 1])[:, None]).double()
    whole = float(aggregate_loss(per_token, mask, token_level))
    for split in ([[0, 1, 2], [3, 4], [5, 6, 7]], [[1], [0, 2, 3, 4, 5, 6, 7]], [[i] for i in range(8)]):
        parts = sum(
            float(aggregate_loss(per_token[rows], mask[rows], token_level)) * micro_batch_weight(mask[rows], mask, token_level)
            for rows in map(torch.tensor, split)
        )
        assert parts == pytest.approx(whole, abs=1e-12)


def test_token_level_weighs_long_responses_more():
    # two responses with equal advantage: token-level gives the 4-token one 4x the gradient
    # of the 1-token one; sample-level gives both the same total gradient
    theta = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    for token_level, ratio in ((True, 4.0), (False, 1.0)):
        loss, _ = clipped_policy_loss(theta, torch.zeros(2, 4), torch.tensor([1.0, 1.0]), mask, 0.2, 0.28, token_level)
        (g,) = torch.autograd.grad(loss, theta)
        assert float(g[0].sum() / g[1].sum()) == pytest.approx(ratio)


def test_keep_mixed_groups():
    correct = torch.tensor([[True, True, True], [False, False, False], [True, False, False]])
    assert keep_mixed_groups(correct).tolist() == [False, False, True]


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere():
    # d = ref - logp = 1: e^1 - 1 - 1 = 0.71828
    assert float(k3_kl(torch.tensor(0.0), torch.tensor(0.0))) == 0.0
    assert float(k3_kl(torch.tensor(0.0), torch.tensor(1.0))) == pytest.approx(math.e - 2)
