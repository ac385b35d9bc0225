"""`key=value` overrides after the spec on `run`, `validate`, `status` and `sweep`: applied by the
spec's own dotted paths, validated like the file, an unknown key or bad value is one sentence
with exit status 2.

The two end-to-end tests start the real command as a subprocess with a recording cell function
chosen through ``DAPO_ABLATE_CELL_FN=test_overrides:<function>`` (this folder is put on the
PYTHONPATH of the driver and, through it, of its Ray workers).

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_overrides_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import ExperimentSpec, load_spec
from dapo_ablate.cli.main import app
from dapo_ablate.ablation.experiment.overrides import OverrideError, is_field_path, load_spec_with_overrides
from dapo_ablate.sweeps.spec import SweepSpec

from tiny_configs import STAND_IN_TRAINER


TRAINER = STAND_IN_TRAINER


# -- helpers ---------------------------------------------------------------------------------------
def write_spec(tmp_path: Path, trainer: Any = None, **fields: Any) -> Path:
    out = tmp_path / "out"
    data = {
        "name": "ovr", "trainer": TRAINER if trainer is None else trainer, "factors": ["overlong_filter", "clip_higher"],
        "seeds": 1, "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db",
        "tracking": {"uri": f"sqlite:///{out}/mlflow.db"}, "executor": {"retries": 0, "max_concurrent": 2},
    } | fields
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def write_sweep(tmp_path: Path, **fields: Any) -> Path:
    out = tmp_path / "out"
    data = {
        "name": "ovr-sweep", "trainer": TRAINER, "space": {"eps_high": {"low": 0.2, "high": 0.5}},
        "n_trials": 6, "sampler": {"type": "random", "seed": 3}, "pruner": "none",
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db",
        "tracking": {"uri": f"sqlite:///{out}/mlflow.db"}, "executor": {"retries": 0, "max_concurrent": 2},
    } | fields
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BAD = {
    "unknown key": (["trainer.algorithm.eps_hihg=0.3"], "did you mean trainer.algorithm.eps_high"),
    "a leaf without its section": (["max_concurrent=1"], "did you mean executor.max_concurrent"),
    "bad value": (["executor.max_concurrent=0"], "`executor.max_concurrent`"),
    "bad trainer value": (["trainer.algorithm.eps_high=0.1"], "eps_high"),
    "not key=value": (["seeds"], "is not key=value"),
    # a YAML alias bomb (9**8 values once expanded): refused under the file loader's limits, not expanded
    "alias bomb": (["seeds=" + "{a: &a [0,0,0,0,0,0,0,0,0], " + ", ".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(7)) + "}"],
        "through YAML aliases"),
}


# -- applying overrides ------------------------------------------------------------------------------
def test_spec_paths_are_checked_against_the_models_fields():
    assert is_field_path(ExperimentSpec, "trainer.algorithm.eps_high")
    assert is_field_path(ExperimentSpec, "executor.max_concurrent") and is_field_path(ExperimentSpec, "seeds")
    assert is_field_path(ExperimentSpec, "executor")  # a whole section
    assert not is_field_path(ExperimentSpec, "trainer.algorithm.eps_hihg")
    assert not is_field_path(ExperimentSpec, "seeds.first")  # inside a list
    assert is_field_path(SweepSpec, "space.eps_high.high") and is_field_path(SweepSpec, "space.lr")  # a free mapping
    assert not is_field_path(SweepSpec, "space.eps_high.highest")


def test_overrides_set_the_spec_and_only_a_changed_trainer_changes_run_ids(tmp_path: Path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(TRAINER))
    path = write_spec(tmp_path, trainer="base.yaml")  # a trainer file: read into the spec to be overridden
    original = [run.run_id for run in expand(load_spec(path)).runs]

    def run_ids(*items: str) -> tuple[ExperimentSpec, list[str]]:
        spec = load_spec_with_overrides(ExperimentSpec, path, list(items), kind="spec")
        return spec, [run.run_id for run in expand(spec).runs]

    spec, ids = run_ids("executor.max_concurrent=1", "trainer.schedule.total_steps=6")  # 6: the file's value
    assert spec.executor.max_concurrent == 1 and ids == original
    spec, ids = run_ids("trainer.algorithm.eps_high=0.3")
    assert spec.trainer.algorithm.eps_high == 0.3 and spec.trainer.schedule.total_steps == 6
    assert len(ids) == 4 and not set(ids) & set(original)
    spec, ids = run_ids("seeds=[0, 1]")
    assert spec.seeds == [0, 1] and len(ids) == 8 and set(original) <= set(ids)
    assert yaml.safe_load(path.read_text())["trainer"] == "base.yaml"  # the file itself is left as it was


def test_validate_with_overrides_prints_the_overridden_plan_and_writes_nothing(tmp_path: Path):
    path = write_spec(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(path), "seeds=2", "factors=[overlong_filter]"])
    assert result.exit_code == 0, result.output
    assert "4 = 2 unique cells x 2 seeds" in result.stdout
    result = CliRunner().invoke(app, ["run", str(path), "--dry-run", "seeds=3"])
    assert result.exit_code == 0 and "12 = 4 unique cells x 3 seeds" in result.stdout, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


@pytest.mark.parametrize("name", ["validate", "run", "status"])
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_override_is_one_sentence_and_exit_2(tmp_path: Path, name: str, case: str):
    path = write_spec(tmp_path)
    items, expected = BAD[case]
    result = CliRunner().invoke(app, [name, str(path), *items, "--no-progress"] if name == "run" else [name, str(path), *items])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert expected in result.stderr and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


@pytest.mark.parametrize(
    "items, expected",
    [
        (["space.eps_high.highest=0.6"], "did you mean"),
        (["n_trials=0"], "`n_trials`"),
        (["pruner.n_startup_trials=2"], "override the whole `pruner` instead"),  # the file says `pruner: none`
    ],
)
def test_a_bad_sweep_override_is_one_sentence_and_exit_2(tmp_path: Path, items: list[str], expected: str):
    path = write_sweep(tmp_path)
    result = CliRunner().invoke(app, ["sweep", str(path), *items, "--dry-run"])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_parse_error_of_a_file_is_still_the_files_sentence(tmp_path: Path):
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "missing.yaml"), "seeds=2"])
    assert result.exit_code == 2 and "does not exist" in result.stderr
    with pytest.raises(OverrideError, match="not a sweep field"):
        load_spec_with_overrides(SweepSpec, write_sweep(tmp_path), ["nope=1"], kind="sweep")


def test_a_field_an_override_made_pointless_names_the_command_line_fix(tmp_path: Path):
    """A fraction's `resolution` under `design=full` typed on the command line: the sentence says
    how to drop it there too, and that fix validates."""
    path = write_spec(tmp_path, design="fractional", resolution="III",
                      factors=["overlong_filter", "clip_higher", "soft_overlong"])
    refused = CliRunner().invoke(app, ["validate", str(path), "design=full"])
    assert refused.exit_code == 2
    assert "`resolution`: only applies to design: fractional or adaptive (this is full); remove it from the file, " \
           "or add `resolution=null` to the command line" in refused.output
    fixed = CliRunner().invoke(app, ["validate", str(path), "design=full", "resolution=null"])
    assert fixed.exit_code == 0 and "8 = 8 unique cells x 1 seed" in fixed.stdout, fixed.output
