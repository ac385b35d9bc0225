"""`silence_third_party_output()`: no third-party progress bar reaches stderr (a Ray task's
stderr is printed above the driver's rich display), whether the library is imported after the
call or was already imported by an earlier task of the same worker. Each case runs in a fresh
subprocess, with a control that draws the same bars without the call.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_cli_quiet_e2e.py."""

from __future__ import annotations

import os
import subprocess
import sys

from dapo_ablate.ablation.runtime.quiet import QUIET_ENVIRONMENT


def stderr_of(before: str, draw: str, silence: bool) -> str:
    """stderr of a fresh interpreter that runs `before`, maybe the call, then `draw`."""
    call = "from dapo_ablate.ablation.runtime.quiet import silence_third_party_output\nsilence_third_party_output()\n"
    environment = {key: value for key, value in os.environ.items() if key not in QUIET_ENVIRONMENT}
    result = subprocess.run(
        [sys.executable, "-c", before + (call if silence else "") + draw],
        capture_output=True, text=True, env=environment,  # no time budget: a busy machine may import slowly
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stderr


def test_the_call_is_idempotent_and_an_explicit_disable_still_decides():
    draw = (
        "from dapo_ablate.ablation.runtime.quiet import silence_third_party_output\n"
        "silence_third_party_output()\nsilence_third_party_output()\n"
        "from tqdm import tqdm\nfor _ in tqdm(range(3), desc='asked for', disable=False): pass\n"
    )
    assert "asked for" in stderr_of("import tqdm\n", draw, silence=False)
