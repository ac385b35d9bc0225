"""The cell function of benchmarks/chaos.py (``DAPO_ABLATE_CELL_FN=chaos_cell:sleepy_cell``).

It runs in the Ray workers of a ``dapo-ablate run`` subprocess. Each call appends ``start <run>
<time>`` to ``$CHAOS_CALLS`` (a file outside ``output_dir``, so a full output disk cannot hide a
call), writes a 4 KB "checkpoint" into its run folder as a trainer would, sleeps
``$CHAOS_SLEEP_S`` and appends ``end <run> <time>`` before returning a result shaped like a run's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _record(kind: str, run: str) -> None:
    with open(os.environ["CHAOS_CALLS"], "a") as handle:
        handle.write(f"{kind} {run} {time.time():.3f}\n")


def sleepy_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    run = Path(run_dir).name
    _record("start", run)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "checkpoint.bin").write_bytes(b"\0" * 4096)
    time.sleep(float(os.environ.get("CHAOS_SLEEP_S", "2")))
    score = 0.25 + 0.5 * bool(config["techniques"]["clip_higher"])
    _record("end", run)
    return {
        "metrics": {"avg@32": score, "finished_at": time.time()},
        "eval_curve": [{"step": 0, "avg@32": 0.25}], "signals": [{"step": 1, "reward": 0.5}], "wall_s": 1.0,
    }
