"""Peak memory of the training log-prob pass (forward + backward) at Qwen2.5's vocabulary.

Shape (results: benchmarks/README.md, "Log-prob pass memory at a real vocabulary"): vocabulary
151,936, batch 4 responses of 4,096 tokens (16-token prompts), on a small random-init Qwen2
decoder (hidden 64, 1 layer), so that the lm-head and the softmax over the
vocabulary, not the decoder, are what is measured. Each case runs in a fresh process and reports
its peak resident memory (ru_maxrss, Python and torch included) and the increase over the process
before the pass.

- `after`:  dapo_ablate.core.logprobs.response_log_probs (selective log-softmax over response
  positions only, lm-head in checkpointed chunks; default chunk).
- `before`: the pass it replaced (fp32 logits, log_softmax and exp over [B, P + T, vocab]). At the
  full shape it needs tens of GB, more than this machine has, so it is measured at smaller
  response lengths and its growth per token is extrapolated linearly to 4 x 4,096 (its big
  tensors are all [B, P + T, vocab], linear in B x T).

    python benchmarks/logprob_memory.py              # all cases, one line each, then a summary
    python benchmarks/logprob_memory.py --case after --batch 4 --tokens 4096
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

VOCAB = 151_936
PROMPT = 16


def build(batch: int, tokens: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=128, max_position_embeddings=PROMPT + tokens + 8,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (PROMPT,), generator=g).tolist() for _ in range(batch)]
    responses = torch.randint(0, VOCAB, (batch, tokens), generator=g)
    mask = torch.ones(batch, tokens)
    return model, prompts, responses, mask


def naive(model, prompts, responses):
    from dapo_ablate.core.logprobs import left_pad, position_ids

    ids, attn = left_pad(prompts, 0)
    P, T = ids.shape[1], responses.shape[1]
    ids, attn = torch.cat([ids, responses], 1), torch.cat([attn, torch.ones_like(responses)], 1)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits[:, P - 1 : P - 1 + T]
    logp = torch.log_softmax(logits.float(), dim=-1)
    token_logp = logp.gather(-1, responses[..., None]).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


def run_case(case: str, batch: int, tokens: int, chunk: int | None = None) -> dict:
    from dapo_ablate.core.logprobs import LogProbSettings, response_log_probs

    torch.set_num_threads(1)
    model, prompts, responses, mask = build(batch, tokens)
    base_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if case == "after":
        logp, _ = response_log_probs(model, prompts, responses, mask, 1.0, 0, LogProbSettings(chunk=chunk))
    else:
        logp, _ = naive(model, prompts, responses)
    (logp * mask).sum().backward()
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": case, "batch": batch, "tokens": tokens, "peak_mb": round(peak_mb), "pass_mb": round(peak_mb - base_mb),
            "seconds": round(seconds, 2)}


def in_subprocess(case: str, batch: int, tokens: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", case, "--batch", str(batch), "--tokens", str(tokens)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["after", "before"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=None, help="lm-head chunk (default: the library's)")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.batch, args.tokens, args.chunk)))
        return
    after = in_subprocess("after", 4, 4096)
    print(json.dumps(after))
    small = [in_subprocess("before", 1, t) for t in (256, 512)]
    for row in small:
        print(json.dumps(row))
    per_token = (small[1]["pass_mb"] - small[0]["pass_mb"]) / (small[1]["tokens"] - small[0]["tokens"])
    before_full = per_token * 4 * (4096 + PROMPT)
    print(f"before (extrapolated, batch 4 x 4,096): {before_full / 1024:.1f} GB for the pass; "
          f"after (measured): {after['pass_mb'] / 1024:.2f} GB for the pass, {after['peak_mb'] / 1024:.2f} GB process peak")


if __name__ == "__main__":
    main()
