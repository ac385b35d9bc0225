"""verl's platform ``cpu``: the device functions verl calls, answered for a machine with no GPU.

Stock verl 0.9.1 registers nvidia, npu and rocm only, and falls back to nvidia when none is
found (blocker 3 of tests/verl_cpu/README.md: device ``cuda``, backend ``nccl``). This platform is chosen
with ``VERL_PLATFORM=cpu``. Its Ray resource stays ``GPU`` because verl's resource pools ask Ray
for GPUs unconditionally: the job starts Ray with fake GPUs (``ray_init.num_gpus``), one per
"device" worker.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any

from verl.plugin.platform import PlatformBase, PlatformRegistry

from verl_cpu_plugin import cpu_device

PLATFORM_NAME = "cpu"


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """Every worker on the host CPU; collectives on gloo; weights to vLLM through shared memory."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        # Not a vendor verl registers engines for: the engine lookup falls back to the device key,
        # which VERL_ENGINE_DEVICE=cuda points at the FSDP engine (registered for cuda/npu only).
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return cpu_device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: only VERL_PLATFORM=cpu selects it

    def current_device(self) -> str:
        return cpu_device.current_device()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        """One device: nothing to select."""

    def synchronize(self, device_index: int | None = None) -> None:
        """CPU ops are synchronous."""

    def manual_seed(self, seed: int) -> None:
        cpu_device.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        cpu_device.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """No CUDA caching allocator (verl sets expandable_segments through this)."""

    def empty_cache(self) -> None:
        """Nothing cached."""

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the fake GPU resource

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        """No device profiler."""

    def profiler_stop(self) -> None:
        """No device profiler."""

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False  # verl then sends weights to vLLM through /dev/shm (verl_weights_* segments)

    def cudart(self) -> Any:
        return None
