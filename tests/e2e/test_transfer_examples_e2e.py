"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_transfer_examples.py
describes; its docstring says what they check."""

from __future__ import annotations

import pytest


def test_a_noisy_verifier_changes_training_rewards_not_the_evaluation():
    from dapo_ablate.core.config import build_trainer_config
    from dapo_ablate.core.trainer import train
    from tiny_configs import TINY_TRAINER

    exact = build_trainer_config({**TINY_TRAINER, "schedule": {"total_steps": 2, "eval_every": 2}})
    noisy = exact.with_overrides({"algorithm.reward_flip": 0.45})
    a, b, again = train(exact), train(noisy), train(noisy)
    def timeless(metrics: dict) -> dict:
        return {k: v for k, v in metrics.items() if not k.startswith("time")}

    assert timeless(a.eval[0]) == timeless(b.eval[0])  # step 0: the same policy, judged by the true verifier
    assert [s["accuracy"] for s in a.signals] != [s["accuracy"] for s in b.signals]
    assert [timeless(s) for s in b.signals] == [timeless(s) for s in again.signals]  # seeded
    with pytest.raises(Exception, match="reward_flip"):
        build_trainer_config({**TINY_TRAINER, "algorithm": {**TINY_TRAINER["algorithm"], "reward_flip": 0.5}})


def test_partial_credit_reaches_the_training_rewards():
    from dapo_ablate.core.config import build_trainer_config
    from dapo_ablate.core.trainer import train
    from tiny_configs import TINY_TRAINER

    binary = build_trainer_config({**TINY_TRAINER, "schedule": {"total_steps": 1, "eval_every": 1}})
    partial = binary.with_overrides({"algorithm.format_reward": 0.5})
    a, b = train(binary), train(partial)
    assert a.signals[0]["accuracy"] == b.signals[0]["accuracy"]  # the same samples, the same verdicts
    assert b.signals[0]["reward"] > a.signals[0]["reward"]  # wrong but well-formed answers earn credit
