"""vLLM rollout engine for GPU machines (`rollout.engine: vllm`, extra `pip install -e ".[vllm]"`).

Implements the `RolloutEngine` interface with vLLM's offline `LLM` in the trainer's process,
colocated with the training model. Behaviour log-probs are *not* taken from vLLM: its sampled-token
log-probs come from its own kernels (and, depending on version and `logprobs_mode`, before or
after temperature and top-p), so the rollout is marked `log_probs_exact=False` and the trainer
recomputes them with one no-grad forward of the training model, as verl does by default.

Weights: after each update `sync_weights` streams the trainer's state dict into vLLM's model
(`load_weights`) through `collective_rpc`, then resets the prefix cache (a stale prefix cache
serves keys computed by old weights). This runs in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0.

Status: exercised only on GPU machines; the CPU test suite does not install vLLM.
"""

from __future__ import annotations

import os

import torch

from .config import TrainerConfig
from .rollout import Rollout


def _load_weights(worker, weights):  # runs inside vLLM's worker
    worker.model_runner.model.load_weights(weights=weights)


class VLLMRolloutEngine:
    def __init__(self, policy, config: TrainerConfig):
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
            max_model_len=None,
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

        params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed,
                                stop_token_ids=[self.eos_token_id], skip_special_tokens=False)
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
