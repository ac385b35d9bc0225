"""The slower cases of tests/unit/test_mixed_precision.py (training in bf16 over fp32 masters): in this
tree so the fast tier stays near a minute."""

from __future__ import annotations

import torch

from dapo_ablate.core.config import ModelConfig
from dapo_ablate.core.policy import load_policy

from test_mixed_precision import _weights_after  # noqa: F401, F811 - shared with the fast part


def test_bf16_compute_over_fp32_masters_trains_at_lr_1e_6(tmp_path):
    initial = {k: v.clone() for k, v in load_policy(ModelConfig()).model.state_dict().items()}
    after_3 = _weights_after(tmp_path, "bf16-3", "bfloat16", 3)
    changed = sum(int((after_3[k] != v).sum()) for k, v in initial.items())
    total = sum(v.numel() for v in initial.values())
    assert all(after_3[k].dtype == torch.float32 for k in initial)  # master weights stay fp32
    assert changed / total > 0.99
