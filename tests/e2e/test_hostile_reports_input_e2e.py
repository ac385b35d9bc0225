"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_hostile_reports_input.py
describes; its docstring says what they check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import HANG_GUARD_S

LOAD = """
import sys
from dapo_ablate.reports import ReportInputError, load_results_csv
try:
    load_results_csv(sys.argv[1])
except ReportInputError as error:
    print("REFUSED:", error)
else:
    print("LOADED")
"""


def load_in_subprocess(path: Path | str) -> str:
    """What load_results_csv(path) says, from a fresh interpreter that is killed after HANG_GUARD_S
    (a hang fails the test) and may not use more than 1 GiB."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (2**30 * 3, 2**30 * 3));"
    result = subprocess.run(
        [sys.executable, "-c", limit + LOAD, str(path)], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "results.csv"
    os.mkfifo(fifo)
    said = load_in_subprocess(fifo)
    assert said.startswith("REFUSED:") and "not a regular file" in said and str(fifo) in said


def test_a_device_is_refused_before_reading(tmp_path):
    said = load_in_subprocess("/dev/zero")
    assert said.startswith("REFUSED:") and "not a regular file" in said and "/dev/zero" in said


def test_a_file_over_the_size_limit_is_refused_by_its_size(tmp_path):
    from dapo_ablate.reports.table import MAX_RESULTS_BYTES

    big = tmp_path / "results.csv"
    with big.open("wb") as handle:  # sparse: no disk space, and nothing to read if it is refused by size
        handle.write(b"a,seed,avg@32\n")
        handle.truncate(MAX_RESULTS_BYTES + 1)
    said = load_in_subprocess(big)
    assert said.startswith("REFUSED:") and "64 MiB" in said and str(big) in said
