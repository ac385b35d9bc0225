"""The rollout engine on the real built-in policy: log-probs, truncation, determinism, top-p."""

import pytest
import torch

from dapo_ablate.core.config import ModelConfig
from dapo_ablate.core.policy import load_policy
from dapo_ablate.core.rollout import HFRolloutEngine, sample_top_p
from dapo_ablate.core.tasks import generate_problems
from dapo_ablate.core.trainer import response_log_probs


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    p = load_policy(ModelConfig())
    p.model.eval()
    return p


@pytest.fixture(scope="module")
def prompts(policy):
    return [policy.encode_prompt(p.prompt) for p in generate_problems(12, seed=3)]


@pytest.mark.parametrize("fast", [True, False])
def test_behaviour_log_probs_match_a_full_forward(policy, prompts, fast):
    engine = HFRolloutEngine(policy.model, policy.eos_token_id, policy.pad_token_id, fast=fast)
    rollout = engine.generate(prompts, 4, 1.0, 1.0, 32, seed=0)
    with torch.no_grad():
        logp, _ = response_log_probs(policy.model, rollout, torch.arange(len(rollout.prompt_ids)), 1.0,
                                     policy.pad_token_id)
    diff = ((logp - rollout.log_probs) * rollout.mask).abs().max()
    assert diff < 1e-4, float(diff)


def test_fast_and_generic_paths_sample_the_same_tokens(policy, prompts):
    fast = HFRolloutEngine(policy.model, policy.eos_token_id, policy.pad_token_id, fast=True)
    slow = HFRolloutEngine(policy.model, policy.eos_token_id, policy.pad_token_id, fast=False)
    a = fast.generate(prompts, 4, 1.0, 0.9, 32, seed=5)
    b = slow.generate(prompts, 4, 1.0, 0.9, 32, seed=5)
    assert torch.equal(a.responses, b.responses) and torch.equal(a.lengths, b.lengths)


def test_lengths_truncation_and_eos(policy, prompts):
    engine = HFRolloutEngine(policy.model, policy.eos_token_id, policy.pad_token_id, max_batch=10)
    r = engine.generate(prompts, 3, 1.0, 1.0, 6, seed=1)  # a 6-token ceiling truncates most
    assert r.responses.shape[0] == 36 and len(r.prompt_ids) == 36
    assert r.prompt_ids[0] == prompts[0] and r.prompt_ids[3] == prompts[1]  # prompt-major layout
    assert torch.equal(r.mask.sum(-1).long(), r.lengths)
    for i in range(36):
        L = int(r.lengths[i])
        ended = int(r.responses[i, L - 1]) == policy.eos_token_id
        assert ended != bool(r.truncated[i])
        assert bool(r.truncated[i]) <= (L == 6)
    assert r.truncated.any()


def test_same_seed_same_samples(policy, prompts):
    engine = HFRolloutEngine(policy.model, policy.eos_token_id, policy.pad_token_id)
    a = engine.generate(prompts, 2, 1.0, 1.0, 32, seed=9)
    b = engine.generate(prompts, 2, 1.0, 1.0, 32, seed=9)
    c = engine.generate(prompts, 2, 1.0, 1.0, 32, seed=10)
    assert torch.equal(a.responses, b.responses) and not torch.equal(a.responses, c.responses)


def test_top_p_keeps_the_nucleus_only():
    # probs 0.5, 0.3, 0.15, 0.05: top-p 0.7 keeps tokens whose preceding mass < 0.7 -> {0, 1}
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    draws = sample_top_p(logits, 0.7, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1}
    share0 = (draws == 0).float().mean()
    assert abs(float(share0) - 0.5 / 0.8) < 0.05  # renormalised within the nucleus


def test_inexact_engine_log_probs_are_recomputed_by_the_training_model(policy, prompts):
    """Engines like vLLM mark their log-probs inexact; the trainer recomputes them."""
    from dapo_ablate.core.config import TrainerConfig
    from dapo_ablate.core.trainer import recompute_behaviour_log_probs

    engine = HFRolloutEngine(policy.model, policy.eos_token_id, policy.pad_token_id)
    exact = engine.generate(prompts, 2, 1.0, 1.0, 32, seed=2)
    inexact = exact.select(torch.arange(len(exact.prompt_ids)))
    inexact.log_probs = torch.zeros_like(exact.log_probs)
    inexact.log_probs_exact = False
    recompute_behaviour_log_probs(TrainerConfig(), policy.model, inexact, micro=5, pad_id=policy.pad_token_id)
    assert inexact.log_probs_exact
    assert ((inexact.log_probs - exact.log_probs) * exact.mask).abs().max() < 1e-4
