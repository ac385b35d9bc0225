"""The slower cases of tests/unit/test_sequential.py (simulated experiments by the hundred): in this
tree so the fast tier stays near a minute."""

from __future__ import annotations

import numpy as np

from dapo_ablate.reports.sequential import (
    UNDECIDED,
    AdaptivePolicy,
    SequentialSettings,
)  # fmt: skip

from test_sequential import _adaptive  # noqa: F401, F811 - shared with the fast part


def test_under_the_global_null_few_experiments_claim_anything():
    """40 seeded adaptive experiments with no effect: at most 6 with a claim. At a true rate of
    5% P(X >= 7) = .004 (binomial 40, .05), so the bound fails only if the rate is well above 5%."""
    rng = np.random.default_rng(2026)
    settings = SequentialSettings(full_information_runs=128)
    claims = [bool(_adaptive(rng, settings, AdaptivePolicy(max_seeds=4))) for _ in range(40)]
    assert sum(claims) <= 6
    assert UNDECIDED  # the names the decisions use are exported
