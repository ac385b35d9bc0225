"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_builtin_settings.py
describes; its docstring says what they check."""

from __future__ import annotations

import torch

from dapo_ablate.core.config import ModelConfig, TrainerConfig, build_trainer_config
from dapo_ablate.core.policy import builtin_recipe

from tiny_configs import TINY_TRAINER

# A few warm-start steps: a real checkpoint of the right shape and vocabulary, built in seconds.
QUICK_WARMSTART = 3


def _quick(overrides: dict) -> TrainerConfig:
    """A one-step run on a barely warm-started policy. Its answers are all wrong and mostly truncated,
    so truncated samples are trained on and a noisy verifier (45% of verdicts flipped) makes groups
    mixed: the update then has nonzero advantages whatever the policy says."""
    config = build_trainer_config({**TINY_TRAINER, "schedule": {"total_steps": 1, "eval_every": 1}})
    return config.with_overrides({"model.builtin_warmup_steps": QUICK_WARMSTART, "algorithm.reward_flip": 0.45,
                                  "techniques.overlong_filter": False, **overrides})


def test_the_large_policy_loads_and_trains_one_step():
    from dapo_ablate.core.trainer import _setup, _train_step

    run = _setup(_quick({"model.builtin_size": "large"}), None)
    assert 1_000_000 <= sum(p.numel() for p in run.model.parameters()) <= 2_000_000
    assert run.model.config.hidden_size == 160 and run.model.config.num_hidden_layers == 4
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    signals = _train_step(run, 1)
    assert signals["tokens_trained"] > 0 and signals["updates"] >= 1 and signals["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in run.model.state_dict().items())
    small = _setup(_quick({}), None)
    assert sum(p.numel() for p in small.model.parameters()) < 400_000


def test_the_comparison_task_trains_one_step_with_its_own_policy_and_verifier():
    from dapo_ablate.core.trainer import _setup, train

    config = _quick({"data.builtin_task": "comparison"})
    run = _setup(config, None)
    assert run.verifier.method == "comparison"
    assert run.policy.tokenizer.convert_tokens_to_ids("less") != run.policy.tokenizer.unk_token_id
    assert run.policy.encode_prompt("7+5?9+4=") == run.policy.tokenizer("7+5?9+4=", add_special_tokens=False)["input_ids"]
    result = train(config)
    assert result.steps == 1 and result.signals[0]["tokens_trained"] > 0 and result.signals[0]["grad_norm"] > 0


def test_a_policy_neither_shipped_nor_cached_is_planned_and_built_on_the_console(tmp_path, monkeypatch):
    """`validate` adds the build to its estimate; `run` builds it before Ray, its progress on the
    console, once (the next `validate` has nothing to build)."""
    from support import dapo_ablate, write_spec

    monkeypatch.setenv("DAPO_ABLATE_CACHE", str(tmp_path / "cache"))
    trainer = {"rollout": {"max_response_len": 64}, "algorithm": {"overlong_cache": 8},
               "model": {"builtin_warmup_steps": 20}}
    spec = write_spec(tmp_path, name="builds", trainer=trainer)
    planned = dapo_ablate("validate", str(spec), cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert "(rough) first, once: building the built-in small policy, addition task, 20 warm-start steps" in planned.stdout
    done = dapo_ablate("run", str(spec), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    building = next(i for i, line in enumerate(lines) if line.startswith("building the built-in small policy"))
    ready = next(i for i, line in enumerate(lines) if line.startswith("built-in policy ready: "))
    started = next(i for i, line in enumerate(lines) if "runs to do" in line)
    assert building < ready < started
    assert len(list((tmp_path / "cache").glob("builtin-*/recipe.json"))) == 1
    again = dapo_ablate("validate", str(spec), cwd=tmp_path)
    assert again.returncode == 0 and "building the built-in" not in again.stdout


def test_the_default_policies_ship_in_the_package_and_load_without_a_build(tmp_path, monkeypatch):
    """A machine with an empty cache loads both default small policies from the package (no
    warm-start runs, nothing is cached): every machine starts from the same weights."""
    from dapo_ablate.core.policy import (
        SHIPPED_DIGESTS,
        SHIPPED_FILES,
        SHIPPED_ROOT,
        load_policy,
    )

    cache = tmp_path / "cache"
    monkeypatch.setenv("DAPO_ABLATE_CACHE", str(cache))
    for task in ("addition", "comparison"):
        digest = builtin_recipe(ModelConfig(), task).digest()
        assert digest in SHIPPED_DIGESTS  # a recipe change must ship its new policy too
        folder = SHIPPED_ROOT / f"builtin-{digest}"
        assert all((folder / name).is_file() for name in SHIPPED_FILES)
        policy = load_policy(ModelConfig(), task)
        assert policy.source == str(folder)
        assert sum(p.numel() for p in policy.model.parameters()) < 400_000
    assert not cache.exists()  # nothing was built
