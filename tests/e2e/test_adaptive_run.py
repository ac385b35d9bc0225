"""design: adaptive through the product's command: `dapo-ablate run` of a design: adaptive spec looks with
the claims engine's group-sequential policy, grows and stops by itself; a driver killed after a
look resumes from the ledger without repeating a look or retraining a run; `status` shows the
current look, its decisions and the budget; a finished adaptive experiment reruns without Ray.
The cells are a cheap stand-in with a planted clip_higher effect (the real trainer on the built-in
task: README's adaptive example)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from dapo_ablate.ablation.runtime.reaper import kill_session
from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
from dapo_ablate.ablation.store.ledger import SQLLedger

from support import pythonpath_with_tests


COMMAND = str(Path(sys.executable).parent / "dapo-ablate")


def planted_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """avg@32 = 0.40 + 0.08 x clip_higher + noise (sd 0.02, fixed by cell and seed); records each call."""
    import numpy as np

    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / "calls", "a") as handle:
        handle.write("call\n")
    time.sleep(float(os.environ.get("CELL_SLEEP_S", "0")))
    techniques, seed = config["techniques"], config["schedule"]["seed"]
    key = f"{sorted(techniques.items())}-{seed}"
    noise = np.random.default_rng(int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)).normal(0, 0.02)
    accuracy = 0.40 + 0.08 * techniques["clip_higher"] + noise
    # a saturating eval curve over 5 evaluations (steps 0, 2, ..., 8; 1000 tokens per step) that ends at `accuracy`
    share = lambda step: (step / 3) ** 1.5 / (1 + (step / 3) ** 1.5) / ((8 / 3) ** 1.5 / (1 + (8 / 3) ** 1.5))  # noqa: E731
    curve = [{"step": step, "avg@32": 0.30 + (accuracy - 0.30) * share(step)} for step in range(0, 9, 2)]
    return {"metrics": {"avg@32": float(accuracy)}, "eval_curve": curve,
            "signals": [{"step": step, "tokens_generated": 1000} for step in range(1, 9)],
            "tokens_generated": 8000, "tokens_discarded": 0, "wall_s": 0.1}


def write_spec(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    data = {"name": "adaptive-cli", "trainer": {"rollout": {"max_response_len": 64}, "algorithm": {"overlong_cache": 8}},
            "factors": ["overlong_filter", "clip_higher", "dynamic_sampling"], "design": "adaptive", "seeds": 2,
            "adaptive": {"max_seeds": 4}, "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db",
            "tracking": {"uri": f"sqlite:///{out}/mlflow.db"}, "executor": {"max_concurrent": 2, "lease_s": 600}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def command(spec_path: Path, *args: str, sleep_s: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, CELL_FN_ENV: "test_adaptive_run:planted_cell", "CELL_SLEEP_S": str(sleep_s),
           "PYTHONPATH": pythonpath_with_tests()}
    return subprocess.Popen([COMMAND, *args, str(spec_path)], cwd=spec_path.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=600)  # a hang guard, not a time budget
    finally:
        kill_session(process.pid)
    return process.returncode, out, err


def looks(spec_path: Path) -> list[dict]:
    path = spec_path.parent / "out" / "ledger.db"
    if not path.is_file():
        return []
    with SQLLedger(f"sqlite:///{path}") as ledger:
        return ledger.looks("adaptive-cli") if ledger.get_experiment("adaptive-cli") else []


def calls(spec_path: Path) -> list[int]:
    return list(calls_by_run(spec_path).values())


def calls_by_run(spec_path: Path) -> dict[str, int]:
    root = spec_path.parent / "out" / "adaptive-cli"
    return {run.name: len((run / "calls").read_text().splitlines()) for run in root.iterdir() if (run / "calls").is_file()}


def test_an_adaptive_experiment_looks_grows_stops_and_resumes_after_a_kill(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    driver = command(spec_path, "run", "--no-progress", sleep_s=0.4)
    try:
        while not looks(spec_path):  # the first look is recorded: kill the driver inside stage 2
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.2)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    finally:
        kill_session(driver.pid)
    first = looks(spec_path)
    assert first[0]["number"] == 1 and first[0]["runs"] == 16  # stage 1: every cell of 3 factors x 2 seeds
    with SQLLedger(f"sqlite:///{spec_path.parent / 'out' / 'ledger.db'}") as ledger:
        done_at_kill = {row["run_id"] for row in ledger.runs_table("adaptive-cli") if row["status"] == "done"}

    code, out, err = finish(command(spec_path, "run", "--no-progress"))
    assert code == 0, err
    found = looks(spec_path)
    assert [look["number"] for look in found] == list(range(1, len(found) + 1)) and found[0] == first[0]
    assert found[-1]["stopped"] and not any(look["stopped"] for look in found[:-1])
    assert "look 1:" not in out and f"look {len(found)}:" in out  # look 1 was not made again
    retrained = {run for run, count in calls_by_run(spec_path).items() if count > 1}
    assert len(retrained) <= 2 and not retrained & done_at_kill  # only runs in flight at the kill started again
    decisions = {row["term"]: row["decision"] for row in found[-1]["terms"]}
    assert decisions["clip_higher"] == "supported"  # the planted 8 pp effect
    assert sum(len(look["added"]) for look in found) + 16 == found[-1]["runs"] == len(calls(spec_path))

    code, out, err = finish(command(spec_path, "status"))
    assert code == 0, err
    assert f"adaptive: look {len(found)} at {found[-1]['runs']} runs: " in out and "1 supported (clip_higher)" in out
    assert "alpha spent" in out and "of at most 32 runs planned" in out

    code, out, err = finish(command(spec_path, "run", "--no-progress"))
    assert code == 0 and "Ray not started" in out, (out, err)

    code, out, err = finish(subprocess.Popen([COMMAND, "report", str(spec_path), "--out", str(tmp_path / "report")],
                                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             start_new_session=True))
    assert code == 0, err
    shown = (tmp_path / "report" / "looks.md").read_text()
    assert "Look 1: 16 runs; " in shown and f"Look {len(found)}: {found[-1]['runs']} runs; " in shown
    assert "clip_higher: +" in shown and "(repeated CI over all looks), supported." in shown and "Runs: " in shown
    page = (tmp_path / "report" / "report.md").read_text()  # the looks and the compute curves are on the page too
    looks_section = page[page.index("## Looks\n"):page.index("## Design")]  # the looks decide: right after the headline
    assert page.index("## Headline") < page.index("## Looks\n") < page.index("## Supported by the data")
    assert "Runs: " in looks_section and "fixed full factorial with the same power" in looks_section  # runs saved
    assert page.count("## Looks of the adaptive design") == 1  # the looks table, once
    table = page[page.index("## Looks of the adaptive design"):]
    assert table[:table.index("\n## ", 5)].count("| clip_higher ") == len(found)  # the looks table: one row per look
    curves = pd.read_csv(tmp_path / "report" / "compute_curves.csv")
    assert list(curves["term"]) == ["overlong_filter", "clip_higher", "dynamic_sampling"]
    assert curves["final_ci_low"].notna().all() and (tmp_path / "report" / "compute_curves.png").exists()
    assert "## Compute curves" in page and "![compute_curves.png](compute_curves.png)" in page
    table = (tmp_path / "report" / "looks.csv").read_text().splitlines()
    assert table[0] == "look,runs,alpha_spent,term,estimate,ci_low,ci_high,decision,unit"
    assert len(table) == 1 + 6 * len(found)  # 3 main effects and 3 interactions at each look
