"""Starting point of each built-in setting used in transfer studies: the warm-started built-in
policy's parameter count, its warm-start time, and its held-out avg@32 / pass@32 at step 0 (one
thread), under each setting's overrides of examples/dapo_cpu.yaml. The figures go in README.md
("Built-in settings").

    .venv/bin/python benchmarks/builtin_settings.py                  # every setting
    .venv/bin/python benchmarks/builtin_settings.py comparison large # settings whose name has a word

A policy not yet cached is built first (its warm-start is timed then and recorded in the
checkpoint's build.json, which later runs read back). With DAPO_ABLATE_CACHE pointing at an empty
folder, every policy is built afresh and timed on this machine.
"""

from __future__ import annotations

import json
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
    "comparison task": {"data.builtin_task": "comparison"},
    "large policy": {"model.builtin_size": "large"},
    "large policy, comparison": {"model.builtin_size": "large", "data.builtin_task": "comparison"},
}


def warmstart_record(checkpoint: str) -> tuple[str, str]:
    """(parameters, warm-start seconds) as recorded when the checkpoint was built."""
    path = Path(checkpoint) / "build.json"
    if not path.is_file():  # built before build.json existed
        return "?", "?"
    build = json.loads(path.read_text())
    return f"{build['parameters'] / 1e6:.2f}M", f"{build['warmstart_s']:.0f}"


def main(words: list[str]) -> None:
    base = load_trainer_config(BASE)
    print(f"{'setting':<28}{'params':>8}{'warm-start s':>14}{'avg@32':>8}{'pass@32':>9}{'held-out':>10}{'eval s':>8}")
    for name, overrides in SETTINGS.items():
        if words and not any(w in name for w in words):
            continue
        config = base.with_overrides(overrides)
        run = _setup(config, None)  # builds the policy when it is not cached
        params = sum(p.numel() for p in run.model.parameters())
        recorded_params, warmstart_s = warmstart_record(run.policy.source)
        answers = [a for _, a in run.task.held_out]
        t0 = time.perf_counter()
        m = evaluate(run.engine, run.eval_prompts, answers, run.policy.decode, run.verifier, run.settings, 0)
        k = config.rollout.eval_k
        print(f"{name:<28}{params / 1e6:>7.2f}M{warmstart_s:>14}{m[f'avg@{k}']:>8.3f}{m[f'pass@{k}']:>9.3f}"
              f"{len(answers):>10}{time.perf_counter() - t0:>8.1f}")
        assert recorded_params in ("?", f"{params / 1e6:.2f}M")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
