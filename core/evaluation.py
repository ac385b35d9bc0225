"""Held-out evaluation: avg@k, pass@k (unbiased) and maj@k, as fractions in [0, 1].

Evaluation sampling is seeded by `schedule.eval_seed` and the step, never by the training seed,
so every run of an ablation evaluates with the same random numbers (common random numbers make
the differences between cells less noisy), and the step-0 evaluation of runs that share a base
policy and evaluation settings is identical: `cached_initial_eval` computes it once per machine.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


import torch

from . import seals
from .atomic import UnreadableFile, own_folder, read_regular, write_text
from .contracts import metric_name
from .metrics import avg_at_k, maj_at_k, mean_pass_at_k
from .policy import file_lock
from .rollout import Rollout, RolloutEngine, derive_seed
from .verifier import Verifier, extract_answer, normalize_answer
from .seals import UNKEYED

CACHE_FORMAT = 1
MAX_ENTRY_BYTES = 2**20
"""A cache entry larger than this is not read (one holds a few numbers)."""
_CACHE_CONTEXT = b"dapo-ablate step-0 evaluation\x00"


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


def cached_initial_eval(cache_dir: Path | None, key: str, compute, seal_key: bytes = UNKEYED,
                        note: Callable[[str], None] = lambda message: None) -> dict[str, float]:
    """Return the cached step-0 evaluation for `key`, computing it under a file lock if absent.

    The cache folder is shared and writable by others, so an entry is sealed (`core.seals`: its key
    and metrics under `seal_key`, the experiment's worker key); an entry that is not (forged,
    edited, another experiment's, an older version's, a link) is passed to `note` and computed
    again, and the fresh entry replaces it."""
    if cache_dir is None:
        return compute()
    own_folder(cache_dir)  # a link planted as the cache folder is replaced, never written through
    path = cache_dir / f"initial-eval-{key}.json"
    with file_lock(cache_dir / f"initial-eval-{key}.lock"):
        if os.path.lexists(path):
            try:
                return _sealed_entry(path, key, seal_key)
            except UnreadableFile as why:
                note(f"the cached step-0 evaluation {path} is not one dapo-ablate sealed ({why}); it is computed again")
        metrics = compute()
        document = {"format": CACHE_FORMAT, "key": key, "metrics": metrics,
                    "hmac": seals.seal(seal_key, _CACHE_CONTEXT, key, _canonical(metrics))}
        write_text(path, json.dumps(document))  # a fresh temporary file: never through a planted link
        return metrics


def _sealed_entry(path: Path, key: str, seal_key: bytes) -> dict[str, float]:
    """The metrics of the cache entry at `path` if sealed for `key` under `seal_key`; else
    UnreadableFile saying why."""
    try:
        document = json.loads(read_regular(path, MAX_ENTRY_BYTES))
    except (ValueError, RecursionError):  # not UTF-8, not JSON
        raise UnreadableFile("it is not JSON") from None
    metrics = document.get("metrics") if isinstance(document, dict) else None
    if not isinstance(metrics, dict) or document.get("format") != CACHE_FORMAT:
        raise UnreadableFile("it is not a sealed entry")
    if not seals.verify(document.get("hmac"), seal_key, _CACHE_CONTEXT, key, _canonical(metrics)):
        raise UnreadableFile("its seal does not match this entry under this experiment's key")
    return metrics


def _canonical(metrics: dict[str, Any]) -> str:
    return json.dumps(metrics, sort_keys=True, separators=(",", ":"))
