"""One floating-point path on every x86-64 CPU, so the built-in task's answer does not depend on the machine.

A run samples its responses from the policy's probabilities; a change in the last bit of a logit
can flip a sampled token once in a long while, and from then on the run follows another path. The
bits depend on which code path the CPU kernels take, and that is chosen by the CPU: PyTorch's own
vectorised kernels (softmax, reductions) by its widest instruction set (AVX2, AVX-512) and MKL's
matrix products by its own dispatch (another on Intel than on AMD, another with AVX-512). Measured
on the built-in task: ATen's kernels at another width, or MKL on another path, change the
gradient norm from the first step on (relative 1e-6); oneDNN is not on the fp32 path.

`pin_cpu_numerics()` pins both to their AVX2 path, which every x86-64 CPU of the last decade has,
before the process's first tensor operation: ATEN_CPU_CAPABILITY=avx2 and MKL_CBWR=AVX2 (MKL's
conditional numerical reproducibility, which Intel documents for its own and compatible CPUs
that support the path). With the shipped built-in policy and one thread per run, a run is then
the same bits on any x86-64 CPU with AVX2. Other CPUs (ARM, or x86 without AVX2) keep their own
path: the same math, with float rounding that can part the sampled paths (their answer differs
within the seed-to-seed noise, not systematically). DAPO_CPU_NUMERICS=native leaves the CPU's own
choice (faster on AVX-512, machine-dependent bits).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

NATIVE_ENV = "DAPO_CPU_NUMERICS"
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
CPUINFO = Path("/proc/cpuinfo")


def has_avx2(cpuinfo: Path = CPUINFO) -> bool:
    """True on an x86-64 CPU whose flags (Linux /proc/cpuinfo) list avx2."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(line.startswith("flags") and "avx2" in line.split() for line in text.splitlines())


def pinned_environment() -> dict[str, str]:
    """The variables that pin this machine's CPU kernels (empty where it cannot, or is told not to)."""
    if os.environ.get(NATIVE_ENV, "").strip().lower() == "native" or not has_avx2():
        return {}
    return dict(PINNED)


def pin_cpu_numerics() -> str:
    """Pin this process's CPU kernels (call before its first tensor operation); return what is in effect."""
    os.environ.update(pinned_environment())
    return numerics_tag()


def numerics_tag() -> str:
    """What this process's CPU kernels run as: 'avx2-pinned', or 'native' (not pinned, or pinned
    after its first tensor operation had fixed ATen's path)."""
    import torch

    pinned = pinned_environment()
    if not pinned or any(os.environ.get(k) != v for k, v in pinned.items()):
        return "native"
    return "avx2-pinned" if torch.backends.cpu.get_cpu_capability() == "AVX2" else "native"
