"""Honest estimates: `validate`'s time per run is the rough reference scaling until runs
of the experiment have finished, then the same scaling calibrated on their measured wall times,
and the printout says which it used."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import calibrate, estimate_run_seconds, expand
from dapo_ablate.ablation.experiment.plan import format_plan
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.cli.main import app
from dapo_ablate.core.config import TrainerConfig

from test_ledger import RESULT
from tiny_configs import TINY_TRAINER


TRAINER = TINY_TRAINER  # 4 steps x 8 prompts x 4 samples x a 32-token ceiling


def write_spec(tmp_path: Path, **fields: object) -> Path:
    out = tmp_path / "out"
    data = {"name": "calib", "trainer": TRAINER, "factors": ["overlong_filter", "clip_higher"], "seeds": 2,
            "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
            **fields}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def finish_runs(spec_path: Path, walls: list[float]) -> None:
    """Record the first len(walls) planned runs as done with these measured wall times, as the
    driver does (the real SQLite ledger)."""
    spec = load_spec(spec_path)
    plan = expand(spec)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        for run, wall in zip(plan.runs, walls):
            assert ledger.claim(run.run_id, "h:1") and ledger.finish(run.run_id, {**RESULT, "wall_s": wall})


def validate(spec_path: Path) -> str:
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_estimate_is_rough_until_runs_finish_then_calibrated_on_their_mean(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path)
    rough = estimate_run_seconds(TrainerConfig(**TRAINER))  # 36 s x (4 x 8 x 4 x 32) / (20 x 64 x 8 x 32) = 0.45 s
    before = validate(spec_path)
    assert f"8 runs x ~{rough:.0f} s each (rough, scaled from the built-in CPU quickstart; calibrated once runs have finished)" in before

    finish_runs(spec_path, [20.0, 40.0, 30.0])  # measured mean 30 s: every cell here does the same work
    after = validate(spec_path)
    assert "8 runs x ~30 s each (calibrated on 3 finished runs in the ledger: measured mean 30 s)" in after, after
    assert "2 at a time -> ~2.0 min wall (4.0 min of run time)" in after  # 8 x 30 s on 2 CPUs
    assert "ledger   3 done, 5 pending: 5 of 8 runs still to do" in after


def test_calibration_keeps_the_scaling_between_cells_of_different_work() -> None:
    """A cell with twice the steps is estimated at twice the measured time of the ones that ran."""
    short = TrainerConfig(**TRAINER)
    long = TrainerConfig(**{**TRAINER, "schedule": {"total_steps": 8, "eval_every": 2}})
    cal = calibrate([(short, 10.0), (short, 14.0)])
    assert cal is not None and cal.runs == 2 and cal.measured_s == 24.0
    assert estimate_run_seconds(short) * cal.factor == pytest.approx(12.0)
    assert estimate_run_seconds(long) * cal.factor == pytest.approx(24.0)
    assert calibrate([]) is None and calibrate([(short, None)]) is None  # type: ignore[list-item]


def test_a_given_time_per_run_wins_over_the_calibration(tmp_path: Path) -> None:
    plan = expand(load_spec(write_spec(tmp_path)))
    cal = calibrate([(plan.runs[0].config, 50.0)])
    assert "(given)" in format_plan(plan, seconds_per_run=60, calibration=cal)
    assert "measured mean 50 s" in format_plan(plan, calibration=cal)
