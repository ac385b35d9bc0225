"""The slower cases of tests/unit/test_sweep_spec.py (the CLI started as a process): in this tree so
the fast tier stays near a minute."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.spec import SpecError
from dapo_ablate.sweeps.spec import build_sweep

from test_sweep_spec import BAD, app, sweep  # noqa: F401, F811 - shared with the fast part


@pytest.mark.parametrize("fields, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_sweep_is_one_sentence_with_exit_status_2(tmp_path, fields, message):
    with pytest.raises(SpecError) as raised:
        build_sweep(sweep(**fields))
    assert message in str(raised.value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(sweep(**fields)))
    for command in (["sweep", str(path), "--dry-run"], ["sweep", str(path)], ["sweep-report", str(path), "--out", str(tmp_path / "r")]):
        result = CliRunner().invoke(app(), command)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and message in lines[0]
    assert not (tmp_path / "r").exists()
