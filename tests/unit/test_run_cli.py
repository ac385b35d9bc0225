"""``dapo-ablate run | validate | status | ui``: the command as a user runs it.

The slow tests start ``dapo-ablate run`` as a subprocess with a cheap-but-not-instant cell
function chosen through ``DAPO_ABLATE_CELL_FN=test_run_cli:<function>`` (this module is put on
the PYTHONPATH of the driver and, through it, of its Ray workers), then kill, interrupt or
rerun it and read the ledger and MLflow it left.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_run_cli_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.cli.main import app


# -- helpers -----------------------------------------------------------------------------------
def write_spec(tmp_path: Path, **fields: Any) -> Path:
    out = tmp_path / "out"
    data = {
        "name": "cli-exp", "trainer": {"rollout": {"max_response_len": 64}, "algorithm": {"overlong_cache": 8}}, "factors": ["overlong_filter", "clip_higher"], "seeds": 1,
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db",
        "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
        "executor": {"retries": 1, "max_concurrent": 2, "lease_s": 600},
    }
    data.update(fields)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# -- mistakes: exit 2, one sentence, nothing written -------------------------------------------
def _file_in(tmp_path: Path) -> str:
    (tmp_path / "a-file").write_text("")
    return str(tmp_path / "a-file" / "runs")


BAD_SPECS = {
    "unknown key": ({"bogus": 1}, "unknown key `bogus`"),
    "unknown factor": ({"factors": ["warp_drive"]}, "unknown factor 'warp_drive'"),
    "no factors": ({"factors": []}, "factors"),
    "seeds below 1": ({"seeds": 0}, "seeds"),
    "impossible fraction": ({"design": "fractional", "factors": ["overlong_filter", "clip_higher"]}, "design"),
    "unreachable Ray address": ({"executor": {"address": "127.0.0.1:1"}}, "cannot reach the Ray cluster at 127.0.0.1:1"),
    "unwritable output folder": ({"output_dir": "FILE"}, "is a file"),
    "unreachable ledger": ({"ledger": "postgresql://postgres@127.0.0.1:1/nowhere"}, "could not connect to the ledger"),
    "more CPUs per run than here": ({"executor": {"cpus_per_run": 4096}}, "cpus_per_run"),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_bad_specs_exit_2_with_one_sentence_and_write_nothing(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    fields, expected = BAD_SPECS[case]
    if fields.get("output_dir") == "FILE":
        fields = {"output_dir": _file_in(tmp_path)}
    spec_path = write_spec(tmp_path, **fields)
    before = sorted(tmp_path.rglob("*"))
    result = CliRunner().invoke(app, ["run", str(spec_path), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(tmp_path.rglob("*")) == before


def test_unreachable_address_option_and_missing_spec_exit_2(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    result = CliRunner().invoke(app, ["run", str(spec_path), "--address", "127.0.0.1:1"])
    assert result.exit_code == 2 and "cannot reach the Ray cluster" in result.stderr
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


# -- validate, status, ui ----------------------------------------------------------------------
def test_validate_and_dry_run_print_the_plan_and_write_nothing(tmp_path: Path):
    spec_path = write_spec(tmp_path, seeds=2)
    for args in (["validate", str(spec_path)], ["run", str(spec_path), "--dry-run"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "8 = 4 unique cells x 2 seeds" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_status_before_any_run_lists_new_runs_and_writes_nothing(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    result = CliRunner().invoke(app, ["status", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "OF+CH" in result.stdout and "new 4" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_status_shows_errors_and_metrics(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import load_spec

    spec = load_spec(spec_path)
    plan = expand(spec)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        first, second = plan.runs[0].run_id, plan.runs[1].run_id
        ledger.claim(first, "here:1")
        ledger.finish(first, {"metrics": {"avg@32": 0.4375}, "wall_s": 12.5})
        ledger.claim(second, "here:1")
        ledger.fail(second, "ValueError: boom (at cell.py:3 in f)")
    result = CliRunner().invoke(app, ["status", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "43.8" in result.stdout and "(pp)" in result.stdout and "12.5 s" in result.stdout and "ValueError: boom" in result.stdout
    assert "new 0  pending 2  running 0  done 1  failed 1" in result.stdout


def test_report_on_an_experiment_without_results_exits_2_and_writes_nothing(tmp_path: Path):
    spec_path = write_spec(tmp_path)
    result = CliRunner().invoke(app, ["report", str(spec_path), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrainer: {}\nfactorz: [clip_higher]\n")
    result = CliRunner().invoke(app, ["report", str(bad), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 2 and "factorz" in result.stderr
