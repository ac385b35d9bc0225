"""The suite gives the same answer however it is started: from a shell's background (`cmd &`) or
under nohup, SIGINT arrives ignored, and the tests that send Ctrl-C must still see it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support import HANG_GUARD_S, ROOT, pythonpath_with_tests


PROBE = '''
import os, signal, subprocess, sys, time

def test_sigint_reaches_this_process():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
    except KeyboardInterrupt:
        return
    raise AssertionError("SIGINT was ignored")

def test_sigint_reaches_a_child_it_starts():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    assert child.wait() != 0  # interrupted (a child that ignored it sleeps 60 s out and exits 0)
'''


def test_sigint_tests_pass_when_the_suite_starts_with_sigint_ignored(tmp_path: Path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    env = {**os.environ, "PYTHONPATH": pythonpath_with_tests()}  # the copied conftest imports `support`
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `&` or nohup starts a job
        capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tmp_path, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 passed" in result.stdout
