"""The train loop on the real built-in policy: determinism, resume, signals, the CLI.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_trainer_e2e.py."""


import pytest
import torch

from dapo_ablate.core.config import TrainerConfig, load_trainer_config
from dapo_ablate.core.trainer import train

from support import ROOT
from tiny_configs import TINY_TRAINER

TINY = {**TINY_TRAINER, "schedule": {"total_steps": 4, "eval_every": 2, "checkpoint_every": 1}}


class NaNLogProbEngine:
    """A rollout engine whose behaviour log-probs are NaN (a broken sampler)."""

    def __init__(self, policy, config):
        from dapo_ablate.core.trainer import default_engine

        self.inner = default_engine(policy, config)

    def generate(self, *args, **kwargs):
        rollout = self.inner.generate(*args, **kwargs)
        rollout.log_probs = torch.full_like(rollout.log_probs, float("nan"))
        return rollout

    def sync_weights(self, model):
        self.inner.sync_weights(model)


def test_builtin_policy_leaves_every_technique_something_to_act_on():
    """At the quickstart budget the warm-started policy starts with room for RL (checked on the
    held-out evaluation in the slow test), runs past the soft-penalty start on at least 5% of
    samples, and returns some all-correct or all-wrong groups."""
    from dapo_ablate.core.policy import load_policy
    from dapo_ablate.core.rollout import HFRolloutEngine
    from dapo_ablate.core.trainer import (
        PromptSampler,
        TrainingPrompts,
        collect_batch,
        load_task,
    )
    from dapo_ablate.core.verifier import Verifier

    config = load_trainer_config(ROOT / "examples" / "dapo_cpu.yaml").with_overrides(
        {"techniques.dynamic_sampling": False})
    torch.set_num_threads(1)
    policy = load_policy(config.model)
    engine = HFRolloutEngine(policy.model, policy.eos_token_id, policy.pad_token_id)
    train_set = load_task(config).train
    prompts = TrainingPrompts(train_set, PromptSampler(len(train_set), 0))
    batch = collect_batch(config, engine, policy, Verifier(), prompts, 1)
    assert batch.stats["overlong_rate"] >= 0.05
    assert batch.stats["groups_mixed"] < 0.9  # some groups are all-correct or all-wrong
    assert 0.10 <= batch.stats["accuracy"] <= 0.60


def test_log_probs_align_with_an_unpadded_forward_of_each_row():
    """The left-padded training layout gives each response token the same log-prob as a forward of
    that row alone (prompt + response, no padding, default positions)."""
    from dapo_ablate.core.policy import load_policy
    from dapo_ablate.core.rollout import HFRolloutEngine
    from dapo_ablate.core.tasks import generate_problems
    from dapo_ablate.core.trainer import response_log_probs

    policy = load_policy(TrainerConfig().model)
    prompts = [policy.encode_prompt(p.prompt) for p in generate_problems(6, seed=11)]
    rollout = HFRolloutEngine(policy.model, policy.eos_token_ids, policy.pad_token_id).generate(prompts, 2, 1.0, 1.0, 32, 0)
    with torch.no_grad():
        batched, _ = response_log_probs(policy.model, rollout, torch.arange(12), 1.0, policy.pad_token_id)
        for i in range(12):
            L, p = int(rollout.lengths[i]), rollout.prompt_ids[i]
            ids = torch.tensor([p + rollout.responses[i, :L].tolist()])
            logits = policy.model(input_ids=ids).logits[0, len(p) - 1 : len(p) - 1 + L]
            alone = torch.log_softmax(logits.float(), -1).gather(-1, rollout.responses[i, :L, None]).squeeze(-1)
            assert torch.allclose(batched[i, :L], alone, atol=1e-4)


def test_a_nan_loss_ends_the_run_with_that_reason(tmp_path):
    from dapo_ablate.core.trainer import NonFiniteError

    config = TrainerConfig(**{**TINY, "schedule": {"total_steps": 2, "eval_every": 0, "checkpoint_every": 1}})
    with pytest.raises(NonFiniteError, match=r"training diverged at step 1: the loss is nan"):
        train(config, tmp_path, engine_factory=NaNLogProbEngine)
    assert not (tmp_path / "checkpoint.pt").exists()  # nothing was stepped or saved with it
