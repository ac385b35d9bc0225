"""Held-out evaluation: avg@k, pass@k (unbiased) and maj@k, as fractions in [0, 1].

Evaluation sampling is seeded by `schedule.eval_seed` and the step, never by the training seed,
so every run of an ablation evaluates with the same random numbers (common random numbers make
the differences between cells less noisy), and the step-0 evaluation of runs that share a base
policy and evaluation settings is identical: `cached_initial_eval` computes it once per machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


import torch

from .contracts import metric_name
from .metrics import avg_at_k, maj_at_k, mean_pass_at_k
from .policy import file_lock
from .rollout import Rollout, RolloutEngine, derive_seed
from .verifier import Verifier, extract_answer, normalize_answer


@dataclass(frozen=True)
class EvalSettings:
    """What an evaluation depends on besides the weights."""

    k: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int


def evaluate(
    engine: RolloutEngine,
    prompts: list[list[int]],
    answers: list[str],
    decode,
    verifier: Verifier,
    settings: EvalSettings,
    step: int,
) -> dict[str, float]:
    """Sample k responses per held-out prompt and score them."""
    k = settings.k
    rollout = engine.generate(
        prompts, k, settings.temperature, settings.top_p, settings.max_new_tokens,
        seed=derive_seed(settings.seed, step),
    )
    texts, correct = score_rollout(rollout, [a for a in answers for _ in range(k)], decode, verifier)
    correct_grid = correct.view(len(prompts), k).tolist()
    extracted = [[_normalized(texts[i * k + j]) for j in range(k)] for i in range(len(prompts))]
    return {
        "step": step,
        metric_name("avg", k): avg_at_k(correct_grid),
        metric_name("pass", k): mean_pass_at_k(correct_grid, k),
        metric_name("maj", k): float(maj_at_k(extracted, correct_grid)),
        "response_length": float(rollout.lengths.float().mean()),
        "truncation_rate": float(rollout.truncated.float().mean()),
        "tokens": int(rollout.num_tokens),
    }


def score_rollout(rollout: Rollout, answers: list[str], decode, verifier: Verifier) -> tuple[list[str], torch.Tensor]:
    """(decoded responses, verified correct [N] bool), one answer per row. Training and evaluation
    share it: a truncated response has no final answer and counts as wrong whatever it says."""
    texts = [decode(rollout.responses[i, : int(rollout.lengths[i])].tolist()) for i in range(len(rollout.prompt_ids))]
    correct = torch.tensor(verifier(texts, answers), dtype=torch.bool) & ~rollout.truncated
    return texts, correct


def _normalized(text: str) -> str | None:
    answer = extract_answer(text)
    return normalize_answer(answer) if answer is not None else None


def initial_eval_key(policy_source: str, eval_problems: list[tuple[Any, str]], settings: EvalSettings, extra: dict) -> str:
    """Content key of a step-0 evaluation: policy, held-out set, sampling settings and verifier."""
    blob = json.dumps(
        {"policy": policy_source, "problems": [[p, a] for p, a in eval_problems], "settings": settings.__dict__, **extra},
        sort_keys=True, default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cached_initial_eval(cache_dir: Path | None, key: str, compute) -> dict[str, float]:
    """Return the cached step-0 evaluation for `key`, computing it under a file lock if absent."""
    if cache_dir is None:
        return compute()
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"initial-eval-{key}.json"
    with file_lock(cache_dir / f"initial-eval-{key}.lock"):
        if path.is_file():
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(path.read_text())
        metrics = compute()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(metrics))
        tmp.replace(path)
        return metrics

