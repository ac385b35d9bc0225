"""vLLM's ``vllm.general_plugins`` entry point: vLLM calls :func:`register` once in each of its
processes (the server actor verl starts, and the engine core) before it builds the model."""

from verl_cpu_plugin import selected


def register() -> None:
    if selected():
        from verl_cpu_plugin import vllm_patches

        vllm_patches.apply()
