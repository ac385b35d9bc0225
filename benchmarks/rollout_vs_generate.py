"""Rollout engine vs transformers' generate() on the built-in policy, same batch and sampling.

    python benchmarks/rollout_vs_generate.py [--prompts 64] [--n 8] [--max-new 32] [--threads 1] [--repeats 3]

Both sample 64 prompts x 8 responses (batch 512) at temperature 1.0, top-p 1.0, up to 32 new
tokens, stopping at EOS; tokens/s counts generated response tokens (EOS included) per second of
wall time; the best of `--repeats` runs of each is reported, interleaved so load hits both alike.
"""

from __future__ import annotations

import argparse
import time

import torch

from dapo_ablate.core.config import ModelConfig
from dapo_ablate.core.policy import load_policy
from dapo_ablate.core.rollout import HFRolloutEngine
from dapo_ablate.core.tasks import generate_problems


def run_engine(policy, prompts, n, max_new, seed) -> tuple[int, float]:
    engine = HFRolloutEngine(policy.model, policy.eos_token_id, policy.pad_token_id, max_batch=4096)
    t0 = time.perf_counter()
    rollout = engine.generate(prompts, n, 1.0, 1.0, max_new, seed=seed)
    return rollout.num_tokens, time.perf_counter() - t0


@torch.no_grad()
def run_generate(policy, prompts, n, max_new, seed) -> tuple[int, float]:
    rows = [p for p in prompts for _ in range(n)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), policy.pad_token_id)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        attn[i, width - len(r):] = 1
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    out = policy.model.generate(
        input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        max_new_tokens=max_new, eos_token_id=policy.eos_token_id, pad_token_id=policy.pad_token_id,
    )
    elapsed = time.perf_counter() - t0
    new = out[:, width:]
    # count tokens up to and including the first EOS, as the engine does
    is_eos = new == policy.eos_token_id
    first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full((len(rows),), new.shape[1]))
    return int(first.sum()), elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policy = load_policy(ModelConfig())
    policy.model.eval()
    prompts = [policy.encode_prompt(p.prompt) for p in generate_problems(args.prompts, seed=7)]
    best = {"engine": 0.0, "generate": 0.0}
    for rep in range(args.repeats):
        for name, fn in (("engine", run_engine), ("generate", run_generate)):
            tokens, seconds = fn(policy, prompts, args.n, args.max_new, seed=rep)
            best[name] = max(best[name], tokens / seconds)
            print(f"{name:9s} rep {rep}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tokens/s")
    print(f"best: engine {best['engine']:,.0f} tokens/s, generate() {best['generate']:,.0f} tokens/s, "
          f"ratio {best['engine'] / best['generate']:.1f}x (batch {args.prompts * args.n}, {args.threads} thread(s))")


if __name__ == "__main__":
    main()
