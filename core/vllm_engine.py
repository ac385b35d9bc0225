"""vLLM rollout engine for GPU machines (`rollout.engine: vllm`, extra `pip install -e ".[vllm]"`).

Implements the `RolloutEngine` interface with vLLM's offline `LLM` in the trainer's process,
colocated with the training model. Behaviour log-probs are *not* taken from vLLM: its sampled-token
log-probs come from its own kernels (and, depending on version and `logprobs_mode`, before or
after temperature and top-p), so the rollout is marked `log_probs_exact=False` and the trainer
recomputes them with one no-grad forward of the training model, as verl does by default.

Weights: after each update `sync_weights` streams the trainer's state dict into vLLM's model
(`load_weights`) through `collective_rpc`, then resets the prefix cache (a stale prefix cache
serves keys computed by old weights). This runs in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0.

Scope: one process, one device: the trainer and vLLM share a GPU (tensor_parallel_size 1), so
`gpu_memory_utilization` must leave room for training. Multi-GPU training (FSDP) and multi-worker
weight sync are not implemented. Status: exercised only on GPU machines; the CPU test suite does
not install vLLM.
"""

from __future__ import annotations

import os

import torch

from .config import TrainerConfig
from .rollout import Rollout


def _load_weights(worker, weights):  # runs inside vLLM's worker
    worker.model_runner.model.load_weights(weights=weights)


class VLLMRolloutEngine:
    def __init__(self, policy, config: TrainerConfig, max_prompt_len: int = 2048):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as err:
            raise RuntimeError(
                "rollout.engine `vllm` needs vLLM installed (pip install -e \".[vllm]\" on a GPU machine); "
                "or set rollout.engine: hf"
            ) from err
        self.eos_token_id, self.pad_token_id = policy.eos_token_id, policy.pad_token_id
        self.llm = LLM(
            model=policy.source,
            dtype=config.model.dtype,
            gpu_memory_utilization=config.rollout.gpu_memory_utilization,
            tensor_parallel_size=config.rollout.tensor_parallel_size,
            # room for the longest prompt plus the full ceiling, so responses end at the ceiling
            # (a truncation the penalty and the filter understand), never at a shorter context
            max_model_len=config.rollout.max_response_len + max_prompt_len,
            enable_prefix_caching=True,
            trust_remote_code=config.model.trust_remote_code,
            seed=config.schedule.seed,
        )

    def sync_weights(self, model: torch.nn.Module) -> None:
        weights = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
        self.llm.collective_rpc(_load_weights, args=(weights,))
        self.llm.reset_prefix_cache()

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed) -> Rollout:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # one SamplingParams per prompt with disjoint seeds: vLLM seeds the i-th of n samples with
        # seed + i, so a shared seed would give sample i of every prompt the same random numbers
        params = [
            SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                           seed=(seed + j * n) % 2**62, skip_special_tokens=False)
            for j in range(len(prompts))
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        rows, responses, truncated = [], [], []
        for prompt, out in zip(prompts, outputs):
            for completion in out.outputs:
                ids = list(completion.token_ids)
                rows.append(list(prompt))
                responses.append(ids)
                truncated.append(completion.finish_reason == "length")
        lengths = torch.tensor([len(r) for r in responses])
        width = int(lengths.max()) if len(responses) else 0
        tokens = torch.full((len(responses), width), self.pad_token_id, dtype=torch.long)
        for i, ids in enumerate(responses):
            tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
        return Rollout(rows, tokens, torch.zeros_like(mask), mask, lengths, torch.tensor(truncated),
                       log_probs_exact=False)
