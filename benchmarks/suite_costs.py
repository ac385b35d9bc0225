"""What each test of the suite costs: a pytest plugin and its summary, to find where CI's time goes.

    PYTHONPATH=benchmarks .venv/bin/pytest -q -n 2 --dist loadfile -p suite_costs   # records
    .venv/bin/python benchmarks/suite_costs.py [--top 40]                             # summarises

The plugin appends one JSON line per test to ``$SUITE_COSTS_DIR`` (default ``.suite-costs``), one
file per pytest process (each xdist worker its own): the test's wall time, its process's own CPU
time, the CPU time of the processes it reaped (every ``dapo-ablate`` it ran, Ray's local daemons
after ``ray.shutdown()`` when they are its children), the machine's busy CPU-seconds over the test
(/proc/stat: with two workers each test also counts the other's), and how many local Ray sessions
started during it (new ``session_*`` folders under Ray's temporary folder; with two workers, either
worker's). The summary groups them by test module, largest wall time first, and prints the totals.
It is a measuring tool, not part of the test run: it never fails a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

RAY_TEMP = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray"
"""Where a local Ray started without ``_temp_dir`` keeps its session folders."""


def costs_dir() -> Path:
    return Path(os.environ.get("SUITE_COSTS_DIR", ".suite-costs"))


def ray_sessions() -> set[str]:
    return {path.name for path in RAY_TEMP.glob("session_2*")} if RAY_TEMP.is_dir() else set()


def machine_busy_s() -> float:
    """The machine's busy CPU-seconds since boot (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any):
    sessions, wall = ray_sessions(), time.monotonic()
    own, reaped, busy = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN), machine_busy_s()
    yield
    record = {"test": item.nodeid, "wall_s": time.monotonic() - wall, "own_cpu_s": cpu_s(resource.RUSAGE_SELF) - own,
              "reaped_cpu_s": cpu_s(resource.RUSAGE_CHILDREN) - reaped, "machine_busy_s": machine_busy_s() - busy,
              "ray_starts": len(ray_sessions() - sessions)}
    costs_dir().mkdir(parents=True, exist_ok=True)
    with (costs_dir() / f"{os.getpid()}.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")


def summarise(folder: Path, top: int) -> str:
    records = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    if not records:
        return f"no records in {folder}: run pytest with -p suite_costs first (PYTHONPATH=benchmarks)"
    keys = ("wall_s", "own_cpu_s", "reaped_cpu_s", "ray_starts")
    modules: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(("tests", *keys), 0.0))
    for record in records:
        module = modules[record["test"].split("::", 1)[0]]
        module["tests"] += 1
        for key in keys:
            module[key] += record[key]
    lines = [f"{len(records)} tests: " + ", ".join(f"{key} {sum(r[key] for r in records):,.0f}" for key in keys),
             f"{'wall s':>8} {'own CPU-s':>9} {'reaped':>7} {'Ray':>4} {'tests':>5}  module"]
    for name, module in sorted(modules.items(), key=lambda item: -item[1]["wall_s"])[:top]:
        lines.append(f"{module['wall_s']:8.1f} {module['own_cpu_s']:9.1f} {module['reaped_cpu_s']:7.1f} "
                     f"{module['ray_starts']:4.0f} {module['tests']:5.0f}  {name}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=costs_dir(), help="the records' folder (default: $SUITE_COSTS_DIR or .suite-costs)")
    parser.add_argument("--top", type=int, default=40, help="how many modules to list")
    args = parser.parse_args()
    print(summarise(args.dir, args.top))


if __name__ == "__main__":
    main()
