"""The slower cases of tests/unit/test_hostile_round3_more.py (real MLflow stores, reports through the
CLI): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.tracking import ChildRun, Tracker
from dapo_ablate.cli.main import app

from support import record_finished, write_spec
from test_hostile_round3_more import recorded  # noqa: F401, F811 - shared with the fast part


@pytest.mark.parametrize("text", [
    '{"trainer_file": 123, "command": 5, "recorded": [1], "overrides": "x"}',
    '{"trainer_file": ["a"], "spec": {"a": 1}}',
    "[" * 100_000 + "]" * 100_000,
], ids=["numbers", "containers", "nesting"])
def test_an_origin_record_someone_else_wrote_is_left_out_of_the_report(recorded, tmp_path, text):
    path, origin = recorded
    origin.write_text(text)
    result = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "report"), "--format", "md"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert f"Spec: dapo-ablate run {path}" in (tmp_path / "report" / "report.md").read_text()


# -- the MLflow parent run id the ledger records -----------------------------------------------------
def test_a_parent_id_edited_to_another_experiments_parent_is_never_written_to(tmp_path):
    """Two experiments share a ledger and an MLflow store; `a`'s ledger row is edited to name `b`'s
    parent run. `report a` wrote a's headline onto b's parent (and `run a` too): now the report is
    written, and one sentence says why it is not logged."""
    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    specs = {name: load_spec(write_spec(tmp_path / name, name, output_dir=str(tmp_path / "out"),
                                        ledger=f"sqlite:///{tmp_path / 'out' / 'ledger.db'}", tracking={"uri": uri}))
             for name in ("a", "b")}
    (tmp_path / "out").mkdir()
    parent_of_b = Tracker(uri, str(tmp_path / "artifacts"), "b").parent_run(None, name="b", tags={})
    record_finished(specs["a"], parent_of_b)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "a" / "spec.yaml"), "--out", str(tmp_path / "report"),
                                      "--format", "md"])
    assert result.exit_code == 2, result.output
    assert (f"not logged to MLflow: the ledger names MLflow run {parent_of_b} as the parent run of 'a', but it is not "
            "that experiment's parent run") in result.output
    assert (tmp_path / "report" / "report.md").is_file()
    logged = Tracker(uri, str(tmp_path / "artifacts"), "b").client.get_run(parent_of_b).data
    assert not any(key.startswith("headline") for key in logged.metrics), logged.metrics


def test_a_parent_id_edited_to_a_child_is_not_taken_for_the_parent(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, str(tmp_path / "artifacts"), "exp")
    parent = tracker.parent_run(None, name="exp", tags={})
    child = tracker.start_child(parent, ChildRun("r1", "baseline s0", {"a": 0}, 0, {}))
    assert tracker.check_parent(child, None).info.run_id == parent
    assert tracker.parent_run(child, name="exp", tags={}) == parent
