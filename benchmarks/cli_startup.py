"""Start-up of the command line: wall time of `dapo-ablate --help`, `--version` and every command's
`--help` (best and median of N fresh processes), as a Markdown table for the README.

    .venv/bin/python benchmarks/cli_startup.py --repeat 10
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dapo_ablate.cli.main import COMMANDS


def timed(exe: str, flags: list[str], repeat: int) -> list[float]:
    """Wall seconds of `repeat` fresh runs of ``exe flags`` (each must exit 0)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([exe, *flags], check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    exe = shutil.which("dapo-ablate", path=str(Path(sys.executable).parent)) or "dapo-ablate"
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.repeat} runs each\n")
    print("| command | best | median |\n| --- | ---: | ---: |")
    for flags in (["--help"], ["--version"], *([name, "--help"] for name in COMMANDS)):
        times = timed(exe, flags, args.repeat)
        print(f"| `dapo-ablate {' '.join(flags)}` | {min(times):.2f} s | {statistics.median(times):.2f} s |", flush=True)


if __name__ == "__main__":
    main()
