"""The slower cases of tests/unit/test_hostile_core_policy.py (the built-in policy's folder loaded into
a real model): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

from dapo_ablate.core.config import ModelConfig
from dapo_ablate.core.policy import load_policy

from test_hostile_core_policy import tiny_folder  # noqa: F401, F811 - shared with the fast part


def test_the_tiny_folder_loads(tiny_folder):
    policy = load_policy(ModelConfig(path=str(tiny_folder)))
    assert policy.encode_prompt("1+2=") != []
