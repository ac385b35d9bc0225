"""Evaluation metrics over k sampled responses per problem: avg@k, pass@k, maj@k.

All return fractions in [0, 1] (docs/contracts.md, "The results table": accuracies are stored as fractions).
- avg@k: mean correctness over all P*k samples; the paper's AIME number is avg@32.
- pass@k: chance that at least one of k samples is correct, estimated without bias from n >= k
  samples (Chen et al., 2021, "Evaluating Large Language Models Trained on Code").
- maj@k: accuracy of the majority-vote answer among k samples (self-consistency).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from dapo_ablate.core.verifier import normalize_answer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct.

    pass@k = 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i): the
    binomials overflow floats for n in the hundreds, the product does not.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(correct: Sequence[Sequence[bool]] | np.ndarray, k: int) -> float:
    """pass@k averaged over problems; ``correct`` is [P, n] bool with n >= k samples each."""
    correct = _as_matrix(correct)
    n = correct.shape[1]
    return float(np.mean([pass_at_k(n, int(c), k) for c in correct.sum(axis=1)]))


def avg_at_k(correct: Sequence[Sequence[bool]] | np.ndarray) -> float:
    """avg@k: mean of ``correct`` [P, k] bool over all P*k samples."""
    return float(_as_matrix(correct).mean())


def maj_at_k(extracted: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> float:
    """maj@k: fraction of problems whose majority answer is correct.

    ``extracted[p][j]`` is sample j's extracted answer (None when it gave none) and
    ``correct[p][j]`` its verdict. Per problem the vote is the most frequent normalised,
    non-empty answer, ties going to the answer seen first; the problem counts as correct when a
    sample carrying the voted answer was verified correct (so the verifier, not string equality
    with the ground truth, decides). A problem with no answer at all counts as wrong. Answers
    that are already normalised may be passed (normalisation is idempotent).
    """
    if len(extracted) != len(correct) or not extracted:
        raise ValueError(
            f"maj@k needs one row of verdicts per problem, got {len(extracted)} and {len(correct)} rows."
        )
    hits = 0
    for answers, verdicts in zip(extracted, correct):
        if len(answers) != len(verdicts):
            raise ValueError(f"maj@k needs one verdict per answer, got {len(answers)} and {len(verdicts)}.")
        normalised = [normalize_answer(a) if a is not None else "" for a in answers]
        votes = Counter(a for a in normalised if a)  # Counter keeps first-seen order among ties
        if not votes:
            continue
        winner = max(votes, key=votes.__getitem__)  # max returns the first maximum
        hits += any(ok for a, ok in zip(normalised, verdicts) if a == winner)
    return hits / len(extracted)


def _as_matrix(correct: Sequence[Sequence[bool]] | np.ndarray) -> np.ndarray:
    matrix = np.asarray(correct, dtype=bool)
    if matrix.ndim != 2 or matrix.size == 0:
        raise ValueError(
            f"expected a non-empty [problems, samples] array of verdicts, got shape {matrix.shape}."
        )
    return matrix
