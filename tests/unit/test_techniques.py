"""One test per DAPO technique: each would fail if the trainer ignored that toggle.

They drive the trainer's own functions (collect_batch, shape_rewards, loss_mask, policy_loss,
compute_advantages) with configs that differ only in one toggle. The rollout engine is a scripted
fake (an expensive dependency around the code under test); the tokenizer is the real built-in one.
"""

import math

import pytest
import torch

from dapo_ablate.core.config import TrainerConfig
from dapo_ablate.core.policy import Policy, builtin_tokenizer
from dapo_ablate.core.rollout import Rollout
from dapo_ablate.core.trainer import (
    PromptSampler,
    TrainingPrompts,
    collect_batch,
    compute_advantages,
    loss_mask,
    policy_loss,
    shape_rewards,
)
from dapo_ablate.core.verifier import Verifier


SMALL = {
    "rollout": {"max_response_len": 20, "eval_k": 4},
    "algorithm": {"group_size": 4, "overlong_cache": 4, "gen_prompts_per_round": 4, "max_gen_rounds": 3},
    "batch": {"prompts_per_step": 2, "mini_batch_size": 8},
}


def config(**techniques) -> TrainerConfig:
    base = TrainerConfig(**SMALL)
    return base.with_overrides({f"techniques.{k}": v for k, v in techniques.items()})


class ScriptedEngine:
    """Returns, for each prompt, the scripted group of response texts for that prompt."""

    def __init__(self, tokenizer, script: dict[str, list[str]], truncate_at: int):
        self.tok, self.script, self.truncate_at = tokenizer, script, truncate_at

    def sync_weights(self, model):
        pass

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed):
        rows, lengths, truncated = [], [], []
        for p in prompts:
            texts = self.script[self.tok.decode(p)]
            assert len(texts) == n
            for text in texts:
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                cut = len(ids) > max_new_tokens
                ids = ids[:max_new_tokens]
                rows.append(ids)
                lengths.append(len(ids))
                truncated.append(cut)
        T = max(lengths)
        resp = torch.zeros(len(rows), T, dtype=torch.long)
        mask = torch.zeros(len(rows), T)
        for i, ids in enumerate(rows):
            resp[i, : len(ids)] = torch.tensor(ids)
            mask[i, : len(ids)] = 1
        return Rollout([list(p) for p in prompts for _ in range(n)], resp, -mask * 0.5, mask,
                       torch.tensor(lengths), torch.tensor(truncated))


@pytest.fixture(scope="module")
def policy():
    return Policy(model=None, tokenizer=builtin_tokenizer(), use_chat_template=False)


# prompts and scripted groups: "1+1=" all correct, "2+2=" all wrong, "3+3=" and "4+4=" mixed
TRAIN = [("1+1=", "2"), ("2+2=", "4"), ("3+3=", "6"), ("4+4=", "8")]
SCRIPT = {
    "1+1=": ["\nAnswer: 2"] * 4,
    "2+2=": ["\nAnswer: 5"] * 4,
    "3+3=": ["\nAnswer: 6", "\nAnswer: 7", "\nAnswer: 6", "\nAnswer: 1"],
    "4+4=": ["\nAnswer: 8", "\nAnswer: 9", "\nAnswer: 8", "\nAnswer: 8"],
}


def run_collect(cfg, policy):
    engine = ScriptedEngine(policy.tokenizer, SCRIPT, cfg.rollout.max_response_len)
    sampler = PromptSampler(size=len(TRAIN), seed=0)
    return collect_batch(cfg, engine, policy, Verifier(method="answer_line"), TrainingPrompts(TRAIN, sampler), step=1)


def test_dynamic_sampling_keeps_only_mixed_groups(policy):
    on = run_collect(config(dynamic_sampling=True), policy)
    n_correct_on = on.correct.sum(-1)
    assert ((n_correct_on > 0) & (n_correct_on < 4)).all() and len(n_correct_on) == 2
    assert on.stats["groups_kept"] == 0.5 and on.stats["tokens_discarded"] > 0
    # the same draws without dynamic sampling: every group is trained on, all-same ones included
    off_cfg = config(dynamic_sampling=False).with_overrides({"batch.prompts_per_step": 4})
    off = run_collect(off_cfg, policy)
    n_correct_off = off.correct.sum(-1)
    assert ((n_correct_off == 0) | (n_correct_off == 4)).sum() == 2
    assert off.stats["groups_kept"] == 1.0 and off.stats["tokens_discarded"] == 0


def test_dynamic_sampling_stops_at_max_gen_rounds_and_trains_on_what_was_kept(policy):
    script = {p: ["\nAnswer: 0"] * 4 for p, _ in TRAIN}  # every group all wrong: nothing is mixed
    cfg = config(dynamic_sampling=True)
    engine = ScriptedEngine(policy.tokenizer, script, cfg.rollout.max_response_len)
    batch = collect_batch(cfg, engine, policy, Verifier(method="answer_line"),
                          TrainingPrompts(TRAIN, PromptSampler(size=4, seed=0)), step=1)
    assert batch.rollout is None and batch.stats["ds_exhausted"] == 1.0
    assert batch.stats["gen_rounds"] == cfg.algorithm.max_gen_rounds


def test_soft_overlong_penalty_appears_only_with_its_toggle():
    # ceiling 20, cache 4: start 16. lengths 10 (no penalty), 18 (-0.5), 20 (-1)
    correct = torch.tensor([True, True, False])
    lengths = torch.tensor([10, 18, 20])
    on, pen_on = shape_rewards(config(soft_overlong=True), correct, lengths)
    off, pen_off = shape_rewards(config(soft_overlong=False), correct, lengths)
    assert on.tolist() == [1.0, 0.5, -2.0] and off.tolist() == [1.0, 1.0, -1.0]
    assert pen_off.abs().sum() == 0 and pen_on.tolist() == [0.0, -0.5, -1.0]


def test_overlong_filter_zeroes_the_loss_weight_of_truncated_samples_only_when_on():
    mask = torch.ones(3, 5)
    rollout = Rollout([[1]] * 3, torch.ones(3, 5, dtype=torch.long), torch.zeros(3, 5), mask,
                      torch.tensor([5, 5, 5]), torch.tensor([False, True, False]))
    on = loss_mask(config(overlong_filter=True), rollout)
    off = loss_mask(config(overlong_filter=False), rollout)
    assert on[1].sum() == 0 and on[0].sum() == 5 and off[1].sum() == 5


def test_overlong_filter_can_leave_truncated_samples_out_of_group_stats():
    # rewards [1, -1, -1(truncated)], filtered_in_group_stats off -> stats over [1, -1]: A = +-0.7071, 0
    cfg = config(overlong_filter=True).with_overrides({"algorithm.filtered_in_group_stats": False})
    adv = compute_advantages(cfg, torch.tensor([[1.0, -1.0, -1.0]]), torch.tensor([[False, False, True]]))
    assert torch.allclose(adv, torch.tensor([[1 / math.sqrt(2), -1 / math.sqrt(2), 0.0]]), atol=1e-5)
    default = compute_advantages(config(overlong_filter=True), torch.tensor([[1.0, -1.0, -1.0]]),
                                 torch.tensor([[False, False, True]]))
    assert default[0, 2] != 0  # by default the truncated sample still counts in the group's stats


def test_upper_clip_bound_moves_only_with_clip_higher():
    # ratio 1.25, A > 0: clipped at 1.2 without clip-higher, free below 1.28 with it
    logp = torch.full((1, 2), math.log(1.25))
    args = (logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    loss_on, m_on = policy_loss(config(clip_higher=True), *args)
    loss_off, m_off = policy_loss(config(clip_higher=False), *args)
    assert float(loss_on) == pytest.approx(-1.25) and m_on["clipfrac_high"] == 0.0
    assert float(loss_off) == pytest.approx(-1.2) and m_off["clipfrac_high"] == 1.0


def test_long_responses_weigh_more_only_with_token_level_loss():
    # response 0 has 4 tokens, response 1 has 1; equal advantages
    theta = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    weights = {}
    for on in (True, False):
        loss, _ = policy_loss(config(token_level_loss=on), theta, torch.zeros(2, 4), torch.tensor([1.0, 1.0]), mask)
        (g,) = torch.autograd.grad(loss, theta)
        weights[on] = float(g[0].sum() / g[1].sum())
    assert weights[True] == pytest.approx(4.0) and weights[False] == pytest.approx(1.0)


def test_dynamic_sampling_filters_on_correctness_not_reward_and_discards_the_surplus(policy):
    # "2+2=" is all wrong, but its responses reach into the soft-penalty zone (ceiling 20, start 16)
    # by different amounts, so its rewards differ: a filter on reward spread would keep it.
    script = dict(SCRIPT)
    script["2+2="] = ["1,2,3,4,5\nAnswer: 5", "1,2,3,4,5,6\nAnswer: 5", "1,2,3,4,5,6,7\nAnswer: 5", "\nAnswer: 5"]
    cfg = config(dynamic_sampling=True, soft_overlong=True).with_overrides(
        {"batch.prompts_per_step": 1, "batch.mini_batch_size": 4})
    engine = ScriptedEngine(policy.tokenizer, script, cfg.rollout.max_response_len)
    rewards, _ = shape_rewards(cfg, torch.zeros(4, dtype=torch.bool),
                               torch.tensor([len(policy.tokenizer(t)["input_ids"]) + 1 for t in script["2+2="]]))
    assert rewards.unique().numel() > 1  # the all-wrong group's rewards do differ
    batch = collect_batch(cfg, engine, policy, Verifier(method="answer_line"),
                          TrainingPrompts(TRAIN, PromptSampler(size=4, seed=0)), step=1)
    # one round of 4 prompts: two mixed groups, one kept (prompts_per_step 1), the other discarded
    assert batch.correct.shape == (1, 4)
    n = int(batch.correct.sum())
    assert 0 < n < 4
    assert batch.stats["gen_rounds"] == 1 and batch.stats["groups_mixed"] == 0.5
    kept_tokens = float(batch.rollout.lengths.sum())
    assert batch.stats["tokens_discarded"] == batch.stats["tokens_generated"] - kept_tokens
