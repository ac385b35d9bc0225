"""Response log-probs and entropies in bounded memory, without paying for padding.

The naive pass builds fp32 logits, log_softmax and exp over [rows, prompt + widest response,
vocab]: at a 152k vocabulary and 20k tokens that is hundreds of GB. Here:

- the decoder runs once over [rows, widest prompt + widest response *of these rows*] (callers sort
  rows by length, so a micro-batch does not pay for the step's widest response);
- the lm-head is applied only at response positions (the prompt's logits are never built), in
  chunks of ``chunk`` positions, each turned into the sampled token's log-prob and the entropy
  (a selective log-softmax: logit[token] - logsumexp) and then dropped. With gradients, each chunk
  is recomputed in the backward pass (activation checkpointing), so only one chunk's [chunk, vocab]
  fp32 blocks (logits, one softmax-sized temporary) are alive at a time: peak memory is
  O(chunk x vocab), not O(T x vocab). The default chunk keeps one block near 128 MB (220
  positions at Qwen2.5's 151,936-token vocabulary; a whole micro-batch for tiny vocabularies,
  which then skips the recomputation). benchmarks/logprob_memory.py measures the peak.

Rows are laid out as during sampling: [left-padded prompt | response], position ids counting
from the first real prompt token, so the positions match the decoding loop's.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

BLOCK_ELEMENTS = 2**25
"""fp32 logits per lm-head chunk when no chunk is given (128 MB)."""


def auto_chunk(vocab_size: int) -> int:
    """Response positions per lm-head chunk so that one [chunk, vocab] fp32 block is BLOCK_ELEMENTS."""
    return max(1, BLOCK_ELEMENTS // vocab_size)


def left_pad(rows: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [B, W], attention mask [B, W]), right-aligned (left-padded) to W."""
    width = max(len(r) for r in rows) if width is None else width
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r)
            attn[i, width - len(r) :] = 1
    return ids, attn


def position_ids(attn: torch.Tensor) -> torch.Tensor:
    """Positions counted from each row's first real token (padding on the left gets 0)."""
    return (attn.cumsum(-1) - 1).clamp(min=0)


def compute_context(model: torch.nn.Module, dtype: torch.dtype):
    """Autocast to the compute dtype over fp32 master weights (a no-op in fp32).

    Matmuls run in bf16/fp16 while the parameters, their gradients and AdamW's state stay fp32,
    as FSDP's mixed precision does; a bf16 weight stepped by AdamW at lr 1e-6 would round the
    update away.
    """
    if dtype == torch.float32:
        return nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=dtype)


def _split_model(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder returning hidden states, lm_head) of a Hugging Face causal LM."""
    base = getattr(model, model.base_model_prefix, None) or model.get_decoder()
    return base, model.get_output_embeddings()


def _selective(head_weight: torch.Tensor, head_bias, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float):
    """hidden [n, H], tokens [n] -> (log-prob of each token [n], entropy [n]) at ``temperature``, fp32."""
    logits = torch.nn.functional.linear(hidden, head_weight, head_bias).float()
    if temperature != 1.0:
        logits = logits.div_(temperature)  # in place: one [n, vocab] block fewer (linear keeps no output)
    lse = torch.logsumexp(logits, dim=-1)
    token_logp = logits.gather(-1, tokens[:, None]).squeeze(-1) - lse
    with torch.no_grad():  # entropy = lse - sum(p * logits), one temporary block, updated in place
        weighted = torch.softmax(logits.detach(), dim=-1).mul_(logits.detach())
        entropy = lse.detach() - weighted.sum(-1)
        del weighted
    return token_logp, entropy


@dataclass(frozen=True)
class LogProbSettings:
    """How the log-prob pass runs (its memory and precision), not what it computes."""

    chunk: int | None = None
    """Response positions per lm-head chunk (None: `auto_chunk` of the vocabulary)."""
    compute_dtype: torch.dtype = torch.float32
    """Autocast dtype of the forward (`compute_context`); the weights stay fp32."""


def response_log_probs(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    responses: torch.Tensor,
    mask: torch.Tensor,
    temperature: float,
    pad_id: int,
    settings: LogProbSettings = LogProbSettings(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [B, T] of ``responses`` (right-padded, ``mask`` 1 on real tokens) and token
    entropies [B, T] (no gradient), 0 at padding; T = responses.shape[1].

    Gradients flow through the log-probs when grad mode is on. Only the columns up to the widest
    real response are computed (trailing padding columns are returned as 0). ``settings``: the
    lm-head chunk and the compute dtype.
    """
    device = next(model.parameters()).device
    B, T = responses.shape
    lengths = mask.sum(-1).long()
    width = int(lengths.max()) if B else 0
    out_logp = torch.zeros((B, T), device=device)
    out_entropy = torch.zeros((B, T))
    if width == 0:
        return out_logp.cpu() if device.type != "cpu" else out_logp, out_entropy
    prompt, prompt_attn = left_pad(prompt_ids, pad_id)
    P = prompt.shape[1]
    ids = torch.cat([prompt, responses[:, :width]], dim=1).to(device)
    # padding after EOS is masked out of the loss, and causal attention never looks ahead
    attn = torch.cat([prompt_attn, torch.ones((B, width), dtype=torch.long)], dim=1).to(device)
    base, head = _split_model(model)
    with compute_context(model, settings.compute_dtype):
        hidden = base(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).last_hidden_state
        # the hidden state at position p predicts token p + 1: response token j is predicted at P - 1 + j
        valid = mask[:, :width].bool().to(device)
        rows, cols = valid.nonzero(as_tuple=True)
        h = hidden[rows, P - 1 + cols]  # [n, H], response positions only
        targets = ids[rows, P + cols]
        chunk = settings.chunk or auto_chunk(head.weight.shape[0])
        logps, entropies = [], []
        for start in range(0, len(rows), chunk):
            piece = (head.weight, head.bias, h[start : start + chunk], targets[start : start + chunk], temperature)
            if torch.is_grad_enabled() and len(rows) > chunk:  # one chunk: recomputing it saves nothing
                lp, ent = checkpoint(_selective, *piece, use_reentrant=False)
            else:
                lp, ent = _selective(*piece)
            logps.append(lp)
            entropies.append(ent.detach())
    token_logp = torch.cat(logps) if logps else torch.zeros(0, device=device)
    out_logp = out_logp.index_put((rows, cols), token_logp)
    out_entropy[rows.cpu(), cols.cpu()] = torch.cat(entropies).cpu() if entropies else torch.zeros(0)
    return (out_logp.cpu() if device.type != "cpu" else out_logp), out_entropy


def length_sorted_micro_batches(rows: torch.Tensor, lengths: torch.Tensor, micro: int) -> list[torch.Tensor]:
    """Split ``rows`` into micro-batches of at most ``micro`` rows after sorting them by response
    length, so each micro-batch pays only for its own widest response (the loss weights are per
    micro-batch and sum to the mini-batch's average whatever the grouping)."""
    order = rows[torch.argsort(lengths[rows], stable=True)]
    return [order[i : i + micro] for i in range(0, len(order), micro)]
