"""The built-in verifiable-math task: add a few one-digit numbers.

A problem is `7+3+9+5=` and its answer the sum. Worked solutions come in two styles that the
warm-start data mixes, so that the policy has a real choice for RL to shape:

- concise: the running sums, then the answer line        `10,19,24\nAnswer: 24`
- verbose: every addition written out, then the answer   `7+3=10,10+9=19,19+5=24\nAnswer: 24`

The warm-start traces are noisy: each running sum is off by one with probability `slip_concise`
(concise) or `slip_verbose` (verbose), and the slip carries to the answer. Writing the operands
out is more accurate but longer, so with the quickstart's ceiling the verbose style runs into the
soft-penalty zone on four numbers and is truncated on five or six. This gives every DAPO technique
something to act on: length (overlong filter, soft punishment, token-level loss), groups that come
back all-correct (two numbers) or all-wrong (six), and an error mode for clipping to sharpen away.

Everything is generated from a seed; training and held-out problems come from disjoint seeds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ANSWER_TOKEN = "Answer:"


@dataclass(frozen=True)
class TaskSpec:
    """Parameters of the built-in task (part of the built-in model's recipe hash)."""

    min_terms: int = 2
    """Fewest numbers in a problem."""
    max_terms: int = 6
    """Most numbers in a problem."""
    verbose_share: float = 0.45
    """Share of warm-start traces written in the verbose style."""
    slip_concise: float = 0.3
    """Probability that a running sum is off by one in a concise warm-start trace."""
    slip_verbose: float = 0.08
    """Probability that a running sum is off by one in a verbose warm-start trace."""


@dataclass(frozen=True)
class ArithmeticProblem:
    terms: tuple[int, ...]

    @property
    def prompt(self) -> str:
        return "+".join(str(t) for t in self.terms) + "="

    @property
    def answer(self) -> str:
        return str(sum(self.terms))


def sample_problem(rng: random.Random, spec: TaskSpec) -> ArithmeticProblem:
    n = rng.randint(spec.min_terms, spec.max_terms)
    return ArithmeticProblem(tuple(rng.randint(0, 9) for _ in range(n)))


def generate_problems(n: int, seed: int, spec: TaskSpec = TaskSpec()) -> list[ArithmeticProblem]:
    """n problems from a seeded generator."""
    rng = random.Random(seed)
    return [sample_problem(rng, spec) for _ in range(n)]


def solution_text(problem: ArithmeticProblem, verbose: bool, slips: list[int] | None = None) -> str:
    """A worked solution; slips[i] in {-1, 0, +1} is added to the i-th running sum and carries on."""
    terms = problem.terms
    slips = slips or [0] * (len(terms) - 1)
    running = terms[0]
    steps = []
    for i, term in enumerate(terms[1:]):
        new = max(0, running + term + slips[i])
        steps.append(f"{running}+{term}={new}" if verbose else str(new))
        running = new
    return ",".join(steps) + f"\n{ANSWER_TOKEN} {running}"


def warmstart_example(rng: random.Random, spec: TaskSpec) -> tuple[str, str]:
    """(prompt, noisy worked solution) for the supervised warm-start."""
    problem = sample_problem(rng, spec)
    verbose = rng.random() < spec.verbose_share
    slip = spec.slip_verbose if verbose else spec.slip_concise
    slips = [rng.choice((-1, 1)) if rng.random() < slip else 0 for _ in problem.terms[1:]]
    return problem.prompt, solution_text(problem, verbose, slips)
