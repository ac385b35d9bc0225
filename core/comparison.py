"""The second built-in task: compare two sums, answered with a word.

A problem is `7+5?9+4=`: is the left sum `less` than, `greater` than or `equal` to the right one?
The answer is a comparison word, not a number, so it has its own verifier path
(`verifier.normalize_comparison`; `data.verifier: auto` uses it for this task) and its own
tokens (the words are single tokens of the built-in tokenizer, like `Answer:`).

Worked solutions come in the same two styles as the addition task (core/tasks.py), one running-sum
list per side, `;` between the sides:

- concise: `12;13\\nAnswer: less`
- verbose: `7+5=12;9+4=13\\nAnswer: less`

Warm-start traces slip like the addition task's (a running sum off by one, carried to the side's
total and then to the verdict), so the policy starts with an error mode RL can sharpen away. The
two sums are drawn close (the right one differs from the left by at most `max_gap`, 1), so one slip
can change the verdict, and two slips that cancel do not.
How it differs from the addition task for a transfer study: three possible answers (a guess is
right a third of the time, so all-wrong groups are rarer), a wrong answer is never "close", and
the verdict depends on two totals at once.

Everything is generated from a seed; training and held-out problems come from disjoint seeds
(`COMPARISON_TRAIN_SEED`, `COMPARISON_EVAL_SEED`, neither shared with the addition task).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .tasks import ANSWER_TOKEN

LESS, GREATER, EQUAL = "less", "greater", "equal"
VERDICTS = (LESS, GREATER, EQUAL)
"""The three answers: the left sum's relation to the right sum."""

COMPARISON_TRAIN_SEED = 2_000_000
COMPARISON_EVAL_SEED = 3_000_017
COMPARISON_SYMBOLS = ("?", ";", LESS, GREATER, EQUAL)
"""Tokens the comparison task adds to the built-in tokenizer's character vocabulary."""


@dataclass(frozen=True)
class ComparisonSpec:
    """Parameters of the comparison task (part of its built-in model's recipe hash)."""

    min_side_terms: int = 2
    """Fewest numbers on each side."""
    max_side_terms: int = 3
    """Most numbers on each side."""
    max_gap: int = 1
    """The right sum is the left sum plus a gap drawn uniformly from [-max_gap, max_gap] (1: each
    verdict a third of the time, and one slip can flip any of them)."""
    verbose_share: float = 0.45
    """Share of warm-start traces written in the verbose style."""
    slip_concise: float = 0.5
    """Probability that a running sum is off by one in a concise warm-start trace (traces right
    55% of the time concise, 86% verbose, 69% overall: about the addition task's 62%)."""
    slip_verbose: float = 0.08
    """Probability that a running sum is off by one in a verbose warm-start trace."""


@dataclass(frozen=True)
class ComparisonProblem:
    left: tuple[int, ...]
    right: tuple[int, ...]

    @property
    def prompt(self) -> str:
        return "+".join(map(str, self.left)) + "?" + "+".join(map(str, self.right)) + "="

    @property
    def answer(self) -> str:
        return verdict(sum(self.left), sum(self.right))


def verdict(left: int, right: int) -> str:
    """The comparison word for left ? right."""
    return LESS if left < right else GREATER if left > right else EQUAL


def sample_problem(rng: random.Random, spec: ComparisonSpec) -> ComparisonProblem:
    """Left digits at random; right digits drawn to sum to left + gap (redrawn until they can)."""
    left = tuple(rng.randint(0, 9) for _ in range(rng.randint(spec.min_side_terms, spec.max_side_terms)))
    while True:
        n = rng.randint(spec.min_side_terms, spec.max_side_terms)
        target = sum(left) + rng.randint(-spec.max_gap, spec.max_gap)
        if not 0 <= target <= 9 * n:
            continue
        head = [rng.randint(0, 9) for _ in range(n - 1)]
        last = target - sum(head)
        if 0 <= last <= 9:
            return ComparisonProblem(left, tuple(head + [last]))


def generate_problems(n: int, seed: int, spec: ComparisonSpec = ComparisonSpec()) -> list[ComparisonProblem]:
    """n problems from a seeded generator."""
    rng = random.Random(seed)
    return [sample_problem(rng, spec) for _ in range(n)]


def _side(terms: tuple[int, ...], verbose: bool, slips: list[int]) -> tuple[str, int]:
    """One side's running sums as text, and its (slipped) total."""
    running, steps = terms[0], []
    for term, slip in zip(terms[1:], slips):
        new = max(0, running + term + slip)
        steps.append(f"{running}+{term}={new}" if verbose else str(new))
        running = new
    return ",".join(steps) or str(running), running


def solution_text(problem: ComparisonProblem, verbose: bool, slips: list[int] | None = None) -> str:
    """A worked solution; slips (left side's steps, then the right side's), each in {-1, 0, +1}, are
    added to the running sums and carry to the side's total and to the verdict."""
    n_left = len(problem.left) - 1
    slips = slips or [0] * (n_left + len(problem.right) - 1)
    left_text, left_total = _side(problem.left, verbose, slips[:n_left])
    right_text, right_total = _side(problem.right, verbose, slips[n_left:])
    return f"{left_text};{right_text}\n{ANSWER_TOKEN} {verdict(left_total, right_total)}"


def warmstart_example(rng: random.Random, spec: ComparisonSpec) -> tuple[str, str]:
    """(prompt, noisy worked solution) for the supervised warm-start."""
    problem = sample_problem(rng, spec)
    verbose = rng.random() < spec.verbose_share
    slip = spec.slip_verbose if verbose else spec.slip_concise
    steps = len(problem.left) + len(problem.right) - 2
    slips = [rng.choice((-1, 1)) if rng.random() < slip else 0 for _ in range(steps)]
    return problem.prompt, solution_text(problem, verbose, slips)
