"""avg@k, pass@k and maj@k against hand-computed numbers and an obvious reference."""

from math import comb

import numpy as np
import pytest

from dapo_ablate.core.metrics import avg_at_k, maj_at_k, mean_pass_at_k, pass_at_k


def test_pass_at_k_hand_computed():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the plain success rate: c/n = 3/10
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # n-c < k: every pair contains a correct sample
    assert pass_at_k(3, 2, 2) == 1.0
    assert pass_at_k(8, 0, 4) == 0.0


def test_pass_at_k_matches_the_binomial_formula():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                reference = 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(reference, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 500) overflows a float; the product form does not. 1 - C(999,500)/C(1000,500) = 500/1000
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    correct = [[True, False, False, False], [False, False, False, False]]
    # problem 1: pass@2 = 0.5 (above); problem 2: 0 -> mean 0.25
    assert mean_pass_at_k(correct, 2) == pytest.approx(0.25)


def test_avg_at_k():
    # 3 correct of 2*4 = 8 samples -> 0.375
    assert avg_at_k([[True, False, True, False], [False, False, True, False]]) == pytest.approx(0.375)
    assert avg_at_k(np.ones((3, 32), dtype=bool)) == 1.0
    with pytest.raises(ValueError):
        avg_at_k([])


def test_maj_at_k_hand_computed():
    extracted = [
        ["5", "5", "3", None],  # vote 5 (2 votes), and a 5 is correct -> 1
        ["3", "4", "4", "3"],  # tie 3:2, 4:2 -> the first seen, 3, which is wrong -> 0
        [None, None, None, None],  # no answer -> 0
        ["$1{,}000$", "1000", "7", "7"],  # tie 1000:2 (after normalising), 7:2 -> 1000, correct -> 1
    ]
    correct = [
        [True, True, False, False],
        [False, True, True, False],
        [False, False, False, False],
        [True, True, False, False],
    ]
    # (1 + 0 + 0 + 1) / 4 = 0.5
    assert maj_at_k(extracted, correct) == pytest.approx(0.5)


def test_maj_at_k_uses_the_verifier_verdicts():
    # "0.5" and "\frac{1}{2}" are different strings; the vote is "0.5" (2 votes), verified correct.
    assert maj_at_k([["0.5", "0.5", "\\frac{1}{2}"]], [[True, True, True]]) == 1.0
    assert maj_at_k([["2", "2", "1"]], [[False, False, True]]) == 0.0


def test_maj_at_k_rejects_ragged_input():
    with pytest.raises(ValueError):
        maj_at_k([["1", "2"]], [[True]])
    with pytest.raises(ValueError):
        maj_at_k([["1"]], [])


def test_console_metric_text_is_in_pp_for_accuracies():
    from dapo_ablate.core.contracts import metric_text

    assert metric_text(0.5432, "avg@32") == "avg@32 54.3 pp" and metric_text(1, "pass@4") == "pass@4 100.0 pp"
    assert metric_text(123.456, "response_length") == "response_length 123.5"  # not a fraction: as measured
    assert metric_text(None, "avg@32") == "no metric" and metric_text(True, "avg@32") == "no metric"
