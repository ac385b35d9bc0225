"""Start-up of the command line: `dapo-ablate --help` and `--version` wall time (best and median of N).

    .venv/bin/python benchmarks/cli_startup.py --repeat 10
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    exe = shutil.which("dapo-ablate", path=str(Path(sys.executable).parent)) or "dapo-ablate"
    for flags in (["--help"], ["--version"], ["train", "--help"]):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([exe, *flags], check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
        print(f"dapo-ablate {' '.join(flags):<14} best {min(times):.3f} s  median {statistics.median(times):.3f} s  ({args.repeat} runs)")


if __name__ == "__main__":
    main()
