"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_overrides.py
describes; its docstring says what they check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dapo_ablate.ablation.runtime.reaper import kill_session
from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
from dapo_ablate.ablation.store.ledger import SQLLedger

from support import HANG_GUARD_S, pythonpath_with_tests
from test_overrides import TRAINER, write_spec, write_sweep  # noqa: F401, F811 - shared with the fast part

COMMAND = str(Path(sys.executable).parent / "dapo-ablate")


def recording_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    """Returns the config values the overrides set, as metrics, so the test can read what ran."""
    return {
        "metrics": {"avg@4": config["algorithm"]["eps_high"], "total_steps": config["schedule"]["total_steps"]},
        "eval_curve": [{"step": 0, "avg@4": 0.0}], "signals": [{"step": 1, "reward": 0.5}], "wall_s": 0.1,
    }


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real `dapo-ablate` with the recording cell function, in its own session (reaped after)."""
    environment = {
        **os.environ, CELL_FN_ENV: "test_overrides_e2e:recording_cell",
        "PYTHONPATH": pythonpath_with_tests(),
    }
    process = subprocess.Popen(
        [COMMAND, *args], cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=HANG_GUARD_S)
    finally:
        kill_session(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def ledger_runs(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    """The runs table of experiment `name` (status, metrics, ...)."""
    with SQLLedger(f"sqlite:///{tmp_path / 'out' / 'ledger.db'}") as ledger:
        return ledger.runs_table(name)


# -- the commands, end to end ------------------------------------------------------------------------
def test_run_with_overrides_trains_the_overridden_runs(tmp_path: Path):
    path = write_spec(tmp_path)
    done = command("run", str(path), "--no-progress", "trainer.algorithm.eps_high=0.3", "seeds=[0,1]", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = ledger_runs(tmp_path, "ovr")
    assert len(rows) == 8 and {row["status"] for row in rows} == {"done"} and {row["seed"] for row in rows} == {0, 1}
    # clip_higher off runs train with eps_high = eps_low, but their config still says 0.3
    assert {row["metrics"]["avg@4"] for row in rows} == {0.3}
    # the file's eps_high is another base config: the name is bound to the overridden design
    refused = command("run", str(path), "--no-progress", "executor.max_concurrent=1", cwd=tmp_path)
    assert refused.returncode == 2 and "name=ovr-2" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    again = command("run", str(path), "--no-progress", "executor.max_concurrent=1", "name=ovr-2", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = ledger_runs(tmp_path, "ovr-2")  # the file's eps_high: other run ids, 4 new runs
    assert len(rows) == 4 and {row["status"] for row in rows} == {"done"}
    assert len(ledger_runs(tmp_path, "ovr")) == 8


def test_sweep_with_overrides_runs_the_overridden_trials(tmp_path: Path):
    path = write_sweep(tmp_path)
    done = command("sweep", str(path), "--no-progress", "n_trials=2", "trainer.schedule.total_steps=4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2/2 trials finished" in done.stdout
    rows = ledger_runs(tmp_path, "ovr-sweep")
    assert len(rows) == 2 and {row["metrics"]["total_steps"] for row in rows} == {4}
