"""How close `validate`'s time per run is to the runs' measured mean, rough and calibrated.

    .venv/bin/python benchmarks/estimate_calibration.py [--steps 8] [--seeds 2]

Runs a real experiment on the built-in CPU task through `dapo-ablate run` (examples/dapo_cpu.yaml
with --steps rollout steps, clip_higher x dynamic_sampling, --seeds seeds: 4 x seeds runs, two at a
time) in a temporary folder, then reads the ledger. Held out honestly: the runs that finished first
(half of them) calibrate the estimate exactly as `validate` does (`design.calibrate`), and the
estimate is compared with the measured mean of the other half. Printed: the rough estimate, the
calibrated one, the held-out measured mean, their relative errors, and `validate`'s compute lines
once every run is done.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def write_spec(folder: Path, steps: int, seeds: int) -> Path:
    trainer = yaml.safe_load((ROOT / "examples" / "dapo_cpu.yaml").read_text())
    trainer["schedule"]["total_steps"] = steps
    trainer["schedule"]["eval_every"] = steps
    spec = {"name": "calibration", "trainer": trainer, "factors": ["clip_higher", "dynamic_sampling"], "seeds": seeds,
            "executor": {"cpus_per_run": 1, "max_concurrent": 2, "retries": 0}}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "dapo_ablate.cli.main", *args]


def held_out(spec_path: Path) -> dict[str, float]:
    """Calibrate on the first-finished half, predict the rest's mean."""
    from dapo_ablate.ablation.experiment.design import calibrate, estimate_run_seconds, expand
    from dapo_ablate.ablation.experiment.spec import load_spec
    from dapo_ablate.ablation.store.ledger import SQLLedger

    spec = load_spec(spec_path)
    configs = {run.run_id: run.config for run in expand(spec).runs}
    with SQLLedger(spec.ledger) as ledger:
        rows = sorted((r for r in ledger.runs_table(spec.name) if r["status"] == "done"), key=lambda r: r["finished_at"])
    half = len(rows) // 2
    first, rest = rows[:half], rows[half:]
    cal = calibrate((configs[r["run_id"]], r["wall_s"]) for r in first)
    assert cal is not None, "no finished runs to calibrate on"
    scaled = [estimate_run_seconds(configs[r["run_id"]]) for r in rest]
    measured = sum(r["wall_s"] for r in rest) / len(rest)
    rough = sum(scaled) / len(scaled)
    calibrated = rough * cal.factor
    return {"runs": len(rows), "calibrated_on": cal.runs, "measured_mean_s": measured, "rough_s": rough,
            "calibrated_s": calibrated, "rough_error": rough / measured - 1, "calibrated_error": calibrated / measured - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = write_spec(Path(tmp), args.steps, args.seeds)
        started = time.perf_counter()
        subprocess.run(command("run", str(spec_path), "--no-progress"), cwd=tmp, check=True)
        print(f"experiment: {time.perf_counter() - started:.0f} s wall")
        os.chdir(tmp)  # the spec's stores are relative to where `run` ran
        figures = held_out(spec_path)
        print(f"{figures['runs']} runs; calibrated on the first {figures['calibrated_on']} to finish, "
              f"checked on the other {figures['runs'] - figures['calibrated_on']}:")
        print(f"  measured mean {figures['measured_mean_s']:.1f} s")
        print(f"  rough estimate {figures['rough_s']:.1f} s ({figures['rough_error']:+.0%})")
        print(f"  calibrated estimate {figures['calibrated_s']:.1f} s ({figures['calibrated_error']:+.0%})")
        shown = subprocess.run(command("validate", str(spec_path)), cwd=tmp, check=True, capture_output=True, text=True)
        print("validate, all runs done:")
        print("\n".join(line for line in shown.stdout.splitlines() if "runs x" in line or "at a time ->" in line))


if __name__ == "__main__":
    main()
