"""The built-in task's runs are the same bits whatever path the CPU's kernels would take by themselves
(`core/numerics.py`): `dapo-ablate train` started with another machine's kernel choice in its
environment (ATen's scalar kernels, MKL's SSE-compatible path) gives the same result as one started
with this machine's, and a control without the pin shows that choice does change the bits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dapo_ablate.core.numerics import NATIVE_ENV, has_avx2

from support import HANG_GUARD_S
from tiny_configs import TINY_TRAINER

pytestmark = pytest.mark.skipif(not has_avx2(), reason="the pin is AVX2's path; this CPU has none")

COMMAND = str(Path(sys.executable).parent / "dapo-ablate")
ANOTHER_MACHINE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
CONFIG = {**TINY_TRAINER, "schedule": {"total_steps": 2, "eval_every": 2}}


def trained(folder: Path, name: str, **environment: str) -> dict:
    """The result.json of `dapo-ablate train` in a process with `environment` added (its timings left out)."""
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    env = {k: v for k, v in os.environ.items() if k not in ANOTHER_MACHINE and k != NATIVE_ENV}
    done = subprocess.run([COMMAND, "train", str(config), "--out", str(folder / name)], env={**env, **environment},
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((folder / name / "result.json").read_text())
    strip = lambda rows: [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]  # noqa: E731
    return {"signals": strip(result["signals"]), "eval": strip(result["eval"])}


def test_another_machines_kernel_choice_gives_the_same_bits(tmp_path: Path):
    here = trained(tmp_path, "here")
    assert trained(tmp_path, "elsewhere", **ANOTHER_MACHINE) == here
    # the control: left to the environment's choice, the same run takes other bits
    assert trained(tmp_path, "native", **ANOTHER_MACHINE, **{NATIVE_ENV: "native"})["signals"] != here["signals"]
