"""Starting point of each built-in setting used in transfer studies: the warm-started built-in
policy's held-out avg@32 / pass@32 (step 0, one thread) under each setting's overrides of
examples/dapo_cpu.yaml. The figures go in README.md ("Built-in settings").

    .venv/bin/python benchmarks/builtin_settings.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dapo_ablate.core.config import load_trainer_config
from dapo_ablate.core.evaluation import evaluate
from dapo_ablate.core.trainer import _setup

BASE = Path(__file__).resolve().parents[1] / "examples" / "dapo_cpu.yaml"
SETTINGS = {
    "base (2-6 numbers)": {},
    "easy (2-3 numbers)": {"data.builtin_min_terms": 2, "data.builtin_max_terms": 3},
    "hard (4-6 numbers)": {"data.builtin_min_terms": 4, "data.builtin_max_terms": 6},
    "tight ceiling (16)": {"rollout.max_response_len": 16, "algorithm.overlong_cache": 4},
    "generous ceiling (64)": {"rollout.max_response_len": 64, "algorithm.overlong_cache": 8},
}


def main() -> None:
    base = load_trainer_config(BASE)
    print(f"{'setting':<24}{'avg@32':>8}{'pass@32':>9}{'held-out':>10}{'seconds':>9}")
    for name, overrides in SETTINGS.items():
        config = base.with_overrides(overrides)
        t0 = time.perf_counter()
        run = _setup(config, None)
        answers = [a for _, a in run.task.held_out]
        m = evaluate(run.engine, run.eval_prompts, answers, run.policy.decode, run.verifier, run.settings, 0)
        k = config.rollout.eval_k
        print(f"{name:<24}{m[f'avg@{k}']:>8.3f}{m[f'pass@{k}']:>9.3f}{len(answers):>10}{time.perf_counter() - t0:>9.1f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
