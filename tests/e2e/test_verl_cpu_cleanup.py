"""The cleanup of a verl CPU run ends the run's processes and removes the /dev/shm entries it
created, and touches nothing else: a process without the marker and a segment that existed before
the run survive. Real processes and real shared memory; no verl needed (seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path

from verl_cpu.fixtures import RUN_MARKER_VAR, RunWatch, new_run_marker, run_bounded

# A "run": creates a shared-memory segment and leaves it behind, with a grandchild in a new
# session (as Ray's daemons are, out of the run's process group) that still maps it.
LEAKY_RUN = """
import subprocess, sys
from multiprocessing import shared_memory, resource_tracker
segment = shared_memory.SharedMemory(create=True, size=1 << 20, name=sys.argv[1])
resource_tracker.unregister(segment._name, "shared_memory")  # leak it, as a killed worker would
holder = (
    "from multiprocessing import shared_memory as s, resource_tracker as r; import sys, time\\n"
    "m = s.SharedMemory(name=sys.argv[1]); r.unregister(m._name, 'shared_memory'); print('mapped', flush=True)\\n"
    "time.sleep(600)"
)
child = subprocess.Popen([sys.executable, "-c", holder, sys.argv[1]], start_new_session=True, stdout=subprocess.PIPE, text=True)
child.stdout.readline()  # the grandchild maps the segment before the run exits
print(child.pid, flush=True)
"""


def wait_until(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_cleanup_ends_the_runs_processes_and_segments_and_nothing_else(tmp_path: Path):
    foreign_segment = shared_memory.SharedMemory(create=True, size=4096)  # existed before the run
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # no marker
    name = f"psm_test_{new_run_marker()}"
    try:
        result = run_bounded([sys.executable, "-c", LEAKY_RUN, name], dict(os.environ), tmp_path / "run.log", timeout_s=60)
        orphan = int((tmp_path / "run.log").read_text().split()[0])

        assert result.returncode == 0
        assert any(line.startswith(f"{orphan} ") for line in result.leftovers.killed)
        assert wait_until(lambda: not Path(f"/proc/{orphan}").exists() or ") Z" in Path(f"/proc/{orphan}/stat").read_text())
        assert name in result.leftovers.removed_segments and not Path("/dev/shm", name).exists()
        assert Path("/dev/shm", foreign_segment.name).exists()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        foreign_segment.close()
        foreign_segment.unlink()
        Path("/dev/shm", name).unlink(missing_ok=True)


def test_a_run_past_its_timeout_is_killed_with_its_children(tmp_path: Path):
    marker = new_run_marker()
    hang = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
    start = time.monotonic()
    result = run_bounded([sys.executable, "-c", hang], dict(os.environ), tmp_path / "run.log", timeout_s=3, marker=marker)
    assert result.timed_out and time.monotonic() - start < 60
    watch = RunWatch(marker)
    assert watch.pids() == []
    assert RUN_MARKER_VAR not in os.environ  # the marker is the run's, never the caller's
