"""`core/numerics.py`: which machines get the pinned kernel path (x86-64 with AVX2), and the opt-out.
The end-to-end test (tests/e2e/test_numerics_e2e.py) trains with and without it."""

import platform
from pathlib import Path

import pytest

from dapo_ablate.core import numerics


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\nflags\t\t: fpu sse2 {flags}\n")
    return path


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="an x86-64 rule")
def test_avx2_is_read_from_the_cpu_flags(tmp_path: Path):
    assert numerics.has_avx2(cpuinfo(tmp_path, "avx avx2 fma"))
    assert not numerics.has_avx2(cpuinfo(tmp_path, "avx avx2_vnni_like fma"))  # a whole flag, not a prefix
    assert not numerics.has_avx2(tmp_path / "missing")


def test_pins_only_where_avx2_and_not_told_native(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(numerics.NATIVE_ENV, raising=False)
    monkeypatch.setattr(numerics, "has_avx2", lambda: True)
    assert numerics.pinned_environment() == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
    monkeypatch.setenv(numerics.NATIVE_ENV, "native")
    assert numerics.pinned_environment() == {}
    monkeypatch.delenv(numerics.NATIVE_ENV)
    monkeypatch.setattr(numerics, "has_avx2", lambda: False)
    assert numerics.pinned_environment() == {}
