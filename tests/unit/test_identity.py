"""An experiment you can find again: `run SPEC k=v` records the resolved spec in the
experiment's folder before any run starts; `status`, `report` and `ui` reach the same runs from
the spec with the same overrides or from the folder; the plain spec says how to reach them; every
hint a command prints runs as printed; a finished experiment's rerun starts no Ray.

The experiment is run once per module by the real `dapo-ablate run` (a subprocess) with a cheap
cell function chosen through ``DAPO_ABLATE_CELL_FN=test_identity:<function>`` (this folder is on
the PYTHONPATH of the driver and, through it, of its Ray workers); the other commands run in this
process through CliRunner, the way a user types them (`shlex.split` of the printed hint).

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_identity_e2e.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dapo_ablate.ablation.experiment.spec import ExperimentSpec
from dapo_ablate.ablation.runtime import executor

from tiny_configs import STAND_IN_TRAINER
from support import TESTS


TRAINER = STAND_IN_TRAINER

"""Changes the trainer config, so the runs' ids: the plain spec names other runs."""


# -- helpers ---------------------------------------------------------------------------------------
def stores(out: Path) -> dict[str, Any]:
    return {"output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
            "executor": {"retries": 0, "max_concurrent": 2}}


def test_the_record_is_replaced_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec = ExperimentSpec.model_validate({"name": "atomic", "trainer": TRAINER, **stores(tmp_path / "out")})
    path = executor.record_spec(spec)
    before = path.read_text()

    def broken_replace(source: str, target: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(executor.os, "replace", broken_replace)
    with pytest.raises(OSError):
        executor.record_spec(spec.model_copy(update={"seeds": [0, 1]}))
    assert path.read_text() == before and [p.name for p in path.parent.iterdir()] == ["spec.yaml"]


def test_a_sweeps_record_loads_back_as_the_same_sweep(tmp_path: Path):
    from dapo_ablate.ablation.app.sweep import load_sweep
    from dapo_ablate.sweeps.spec import load_sweep as read_sweep

    overrides = [f"output_dir={tmp_path / 'out'}", f"ledger=sqlite:///{tmp_path / 'out' / 'ledger.db'}", "n_trials=3"]
    spec = load_sweep(TESTS.parent / "examples" / "sweep.yaml", overrides)
    record = executor.record_spec(spec)
    assert record == tmp_path / "out" / spec.name / "sweep.yaml"
    again = read_sweep(record)
    assert again.model_copy(update={"tracking": spec.tracking}) == spec  # the MLflow store by absolute path
    assert again.tracking.uri == f"sqlite:///{Path.cwd() / 'dapo-runs' / 'mlflow.db'}"
    assert load_sweep(record.parent) == again  # the folder in place of the file


def test_the_hint_to_other_runs_keeps_the_users_own_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`status SPEC name=other` on an experiment whose last `run` had another trainer value: the
    printed command keeps `name=other` (without it, it names the spec file's experiment) and adds
    the recorded value; followed as printed, it reaches the recorded runs."""
    import shlex

    import yaml
    from typer.testing import CliRunner

    from dapo_ablate.ablation.experiment.overrides import load_spec_with_overrides
    from dapo_ablate.cli.main import app

    from support import record_finished

    spec_path = tmp_path / "mini.yaml"
    spec_path.write_text(yaml.safe_dump({"name": "mini", "trainer": TRAINER, "factors": ["overlong_filter", "clip_higher"],
                                         "seeds": 1, **stores(tmp_path / "out")}))
    ran_with = ["name=other", "trainer.schedule.total_steps=8"]
    recorded = load_spec_with_overrides(ExperimentSpec, spec_path, ran_with, kind="spec")
    record_finished(recorded)
    executor.record_spec(recorded)
    monkeypatch.chdir(tmp_path)

    shown = CliRunner().invoke(app, ["status", "mini.yaml", "name=other"])
    assert shown.exit_code == 2 and "holds other runs than this spec names" in shown.stderr, shown.output
    printed = [hint for hint in re.findall(r"`(dapo-ablate [^`]+)`", shown.stderr) if "mini.yaml" in hint]
    assert printed == ["dapo-ablate status mini.yaml name=other trainer.schedule.total_steps=8"], shown.stderr
    followed = CliRunner().invoke(app, shlex.split(printed[0])[1:])
    assert followed.exit_code == 0, followed.output
    assert "other (full, 4 runs)" in followed.output and "done 4  failed 0" in followed.output, followed.output
