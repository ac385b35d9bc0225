"""verl jobs on one Ray cluster do not share TransferQueue's controller.

verl 0.9.1 starts TransferQueue 0.1.11 with ``tq.init(config.transfer_queue)``, whose controller is the
Ray actor ``TransferQueueController`` in the namespace ``transfer_queue``, both fixed in its code, with
no config key to give a job its own. So the product runs one verl job at a time per cluster: a spec
asking for more is refused in one sentence, and the driver's limit is capped at one."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.backends.registry import backend_named, jobs_at_once
from dapo_ablate.ablation.runtime.backends.verl_cluster import JOBS_AT_ONCE, concurrent_jobs_problem
from dapo_ablate.cli.main import app

from support import ROOT, write_spec

EXAMPLE = ROOT / "examples" / "paper_verl.yaml"


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"], ["run"]])
def test_a_spec_asking_for_verl_jobs_at_once_is_refused_in_one_sentence_before_anything_is_written(command, tmp_path: Path, monkeypatch):
    spec_path = tmp_path / "paper_verl.yaml"
    spec_path.write_text(EXAMPLE.read_text().replace("  max_concurrent: 1\n", "  max_concurrent: 4\n", 1))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*command, str(spec_path)])
    assert result.exit_code == 2, result.output
    assert concurrent_jobs_problem(4) in " ".join(result.output.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paper_verl.yaml"]


def test_one_verl_job_at_a_time_is_what_the_driver_allows_and_validate_says(tmp_path: Path, monkeypatch):
    assert JOBS_AT_ONCE == 1 and concurrent_jobs_problem(None) is None and concurrent_jobs_problem(1) is None
    assert jobs_at_once(expand(load_spec(EXAMPLE))) == 1  # also when max_concurrent is unset or --max-concurrent asks for more
    assert jobs_at_once(expand(load_spec(write_spec(tmp_path / "cpu")))) is None and backend_named("builtin").jobs_at_once is None
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(EXAMPLE)])
    assert "at most 1 job at a time on one Ray cluster: verl's TransferQueue keeps one controller per cluster" in result.output
