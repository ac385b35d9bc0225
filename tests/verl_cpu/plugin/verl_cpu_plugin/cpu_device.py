"""The ``torch.<device>`` namespace verl gets from the CPU platform (``get_torch_device()``).

verl calls CUDA-allocator functions on whatever module the platform returns (``empty_cache``,
``ipc_collect``, ``memory_allocated``, ``mem_get_info``, ``get_rng_state``, ...); ``torch.cpu`` has
only a few of them. This module gives each one its CPU meaning (a no-op, zero bytes, host memory,
the CPU generator) and forwards anything else to ``torch.cpu``, so a name neither defines still
raises AttributeError instead of silently doing nothing.
"""

from __future__ import annotations

import psutil
import torch


def is_available() -> bool:
    return True


def current_device() -> str:
    # verl's get_device_id() returns this; torch reads an int as cuda:<int>, so it must be "cpu"
    # (blocker 6 of tests/verl_cpu/README.md: tensors sent `.to(get_device_id())` went to cuda:0).
    return "cpu"


def device_count() -> int:
    return 1


def get_device_name(device=None) -> str:
    return "CPU"  # verl's flops table has no CPU entry, so MFU comes out 0 (its "unknown" case)


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


manual_seed_all = manual_seed


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(state)


def empty_cache() -> None:
    """No caching allocator on CPU: nothing to release."""


def ipc_collect() -> None:
    """No CUDA IPC handles on CPU."""


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """No device memory pool to cap on CPU."""


def memory_allocated(device=None) -> int:
    return 0  # no device allocator; host memory is measured from outside (process tree PSS)


memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated


def reset_peak_memory_stats(device=None) -> None:
    """Nothing to reset (see memory_allocated)."""


reset_accumulated_memory_stats = reset_peak_memory_stats


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of host memory, as torch.cuda.mem_get_info gives them for a GPU."""
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def __getattr__(name: str):
    return getattr(torch.cpu, name)  # synchronize, set_device, Stream, Event, stream, current_stream
