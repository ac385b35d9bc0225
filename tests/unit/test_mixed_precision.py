"""Memory-bounded log-probs (against the naive full-vocabulary pass), fp32 masters with bf16
compute, and truncated importance sampling."""

from __future__ import annotations

import pytest
import torch

from dapo_ablate.core.config import ModelConfig, TrainerConfig
from dapo_ablate.core.logprobs import (
    LogProbSettings,
    left_pad,
    length_sorted_micro_batches,
    position_ids,
    response_log_probs,
)
from dapo_ablate.core.policy import load_policy
from dapo_ablate.core.rollout import HFRolloutEngine
from dapo_ablate.core.tasks import generate_problems
from dapo_ablate.core.trainer import importance_advantages, train

from tiny_configs import TINY_TRAINER


def naive_log_probs(model, prompt_ids, responses, temperature, pad_id):
    """The obvious pass: full logits over [B, P + T, V] in fp32, log_softmax, gather, entropy."""
    prompt, attn = left_pad(prompt_ids, pad_id)
    P, T = prompt.shape[1], responses.shape[1]
    ids = torch.cat([prompt, responses], 1)
    attn = torch.cat([attn, torch.ones_like(responses)], 1)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits[:, P - 1 : P - 1 + T]
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(-1, responses[..., None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.fixture(scope="module")
def sampled():
    torch.manual_seed(0)
    policy = load_policy(ModelConfig())
    engine = HFRolloutEngine(policy.model, policy.eos_token_ids, policy.pad_token_id)
    prompts = [policy.encode_prompt(p.prompt) for p in generate_problems(6, seed=5)]
    return policy, engine.generate(prompts, 3, 1.0, 1.0, 24, seed=1)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunked_selective_log_probs_equal_the_naive_pass(sampled, chunk):
    policy, rollout = sampled
    model, m = policy.model, rollout.mask
    with torch.no_grad():
        ref_logp, ref_ent = naive_log_probs(model, rollout.prompt_ids, rollout.responses, 0.7, policy.pad_token_id)
        logp, ent = response_log_probs(model, rollout.prompt_ids, rollout.responses, m, 0.7, policy.pad_token_id,
                                       LogProbSettings(chunk=chunk))
    torch.testing.assert_close(logp, ref_logp * m, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent * m, atol=1e-5, rtol=0)
    if chunk == 1:  # the same entropy as algorithms.token_entropy on the full logits
        from dapo_ablate.core.algorithms import token_entropy

        prompt, attn = left_pad(rollout.prompt_ids, policy.pad_token_id)
        P = prompt.shape[1]
        ids = torch.cat([prompt, rollout.responses], 1)
        attn = torch.cat([attn, torch.ones_like(rollout.responses)], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits
        ref = token_entropy(logits[:, P - 1 : P - 1 + rollout.responses.shape[1]] / 0.7)
        torch.testing.assert_close(ent, ref * m, atol=1e-5, rtol=0)


def test_gradients_through_checkpointed_chunks_equal_the_naive_pass(sampled):
    policy, rollout = sampled
    model, m = policy.model, rollout.mask
    weights = torch.randn(m.shape, generator=torch.Generator().manual_seed(3)) * m

    def grads(fn):
        model.zero_grad()
        (fn() * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    naive = grads(lambda: naive_log_probs(model, rollout.prompt_ids, rollout.responses, 1.0, policy.pad_token_id)[0])
    chunked = grads(lambda: response_log_probs(model, rollout.prompt_ids, rollout.responses, m, 1.0, policy.pad_token_id,
                                               LogProbSettings(chunk=5))[0])
    # fp32 rounding (the chunking reorders each weight gradient's sum over tokens; the two passes
    # round the softmax differently) moves the gradient by ~1e-6 of its norm (more in tensors whose
    # gradient nearly cancels: the key biases); one token's gradient lost moves it by ~1e-4
    diff = torch.cat([(b - a).flatten() for a, b in zip(naive, chunked)])
    error = float(diff.norm() / torch.cat([a.flatten() for a in naive]).norm())
    assert error < 1e-5, error


def test_micro_batches_are_sorted_by_length_and_cover_every_row():
    lengths = torch.tensor([5, 1, 9, 3, 7, 2])
    parts = length_sorted_micro_batches(torch.tensor([0, 2, 3, 4, 5]), lengths, 2)
    assert [p.tolist() for p in parts] == [[5, 3], [0, 4], [2]]


def _weights_after(tmp_path, name, dtype, steps):
    config = TrainerConfig(**{
        **TINY_TRAINER,
        "model": {"threads": 1, "dtype": dtype},
        "optim": {"lr": 1e-6, "warmup_steps": 0},
        "schedule": {"total_steps": steps, "eval_every": 0, "checkpoint_every": 1},
        "data": {"num_eval_problems": 2},
        "rollout": {"max_response_len": 32, "eval_k": 2},
    })
    train(config, tmp_path / name)
    return torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)["model"]


def _policy_gradient(policy, rollout, dtype) -> torch.Tensor:
    """The gradient of a policy-gradient loss on a fixed rollout, with the forward pass computed
    in `dtype` under autocast over fp32 weights, as the trainer does."""
    model = policy.model
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        logp, _ = response_log_probs(model, rollout.prompt_ids, rollout.responses, rollout.mask, 1.0, policy.pad_token_id)
    advantages = torch.linspace(-1.0, 1.0, logp.shape[0])
    (-(logp.float() * advantages[:, None]).sum() / rollout.mask.sum()).backward()
    return torch.cat([p.grad.flatten().clone() for p in model.parameters()])


def test_bf16_compute_gives_the_fp32_update_on_the_same_samples(sampled):
    # Adam's first step is about lr x sign(gradient), so bf16 compute must give the fp32 gradient's
    # direction, and its sign wherever the gradient is not too small for bf16 to resolve. (The same
    # samples: two training runs would sample different responses in bf16 and in fp32.)
    policy, rollout = sampled
    g_fp32 = _policy_gradient(policy, rollout, torch.float32)
    g_bf16 = _policy_gradient(policy, rollout, torch.bfloat16)
    assert torch.nn.functional.cosine_similarity(g_bf16, g_fp32, dim=0) > 0.9
    resolved = g_fp32.abs() > 1e-3 * g_fp32.abs().max()
    assert (torch.sign(g_bf16[resolved]) == torch.sign(g_fp32[resolved])).float().mean() > 0.9


def test_bf16_master_weights_are_refused_in_one_sentence():
    with pytest.raises(ValueError, match="model.param_dtype bfloat16 would step bfloat16 weights with AdamW"):
        TrainerConfig(model={"param_dtype": "bfloat16"})


def test_truncated_importance_weights(sampled):
    _, rollout = sampled
    rollout = rollout.select(torch.arange(4))
    rollout.engine_log_probs = rollout.log_probs.clone()
    rollout.log_probs = rollout.log_probs + torch.log(torch.tensor(3.0)) * rollout.mask  # ratio 3 everywhere
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    config = TrainerConfig(algorithm={"tis_cap": 2.0})
    weighted = importance_advantages(config, rollout, adv)
    torch.testing.assert_close(weighted, adv[:, None] * 2.0 * rollout.mask)  # min(3, cap 2)
    assert importance_advantages(TrainerConfig(), rollout, adv) is adv  # off by default


def test_each_micro_batch_runs_only_to_its_own_widest_response(sampled):
    """A row's log-probs do not depend on which rows share its micro-batch, so the length-sorted
    micro-batches (each as wide as its own longest response) give the whole batch's numbers."""
    policy, rollout = sampled
    batches = length_sorted_micro_batches(torch.arange(len(rollout.prompt_ids)), rollout.lengths, 4)
    assert int(rollout.lengths[batches[0]].max()) < int(rollout.lengths.max())
    with torch.no_grad():
        whole, _ = response_log_probs(policy.model, rollout.prompt_ids, rollout.responses, rollout.mask, 1.0,
                                      policy.pad_token_id)
        for b in batches:
            part, _ = response_log_probs(policy.model, [rollout.prompt_ids[i] for i in b.tolist()],
                                         rollout.responses[b], rollout.mask[b], 1.0, policy.pad_token_id)
            torch.testing.assert_close(part, whole[b][:, : part.shape[1]], atol=1e-5, rtol=0)
