"""Reports never mix: `report` on a spec without the overrides its experiment was last run with
is refused (it would have used the runs this spec names, 4 of 8, and replaced the MLflow parent's
answer with theirs), naming the commands that reach the runs that were run; and a headline
replaces the parent's earlier one as one unit (a NaN interval clears the earlier bound)."""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.spec import build_spec
from dapo_ablate.ablation.runtime.executor import record_spec
from dapo_ablate.cli.main import app

from support import record_finished, spec_data, write_spec

FACTORS = ["overlong_filter", "clip_higher"]


def test_report_without_the_runs_overrides_is_refused_with_the_commands_that_reach_them(tmp_path):
    path = write_spec(tmp_path, "mixed")  # seeds: 1
    ran = build_spec(spec_data(tmp_path, "mixed", seeds=2))  # what `run spec.yaml seeds=2` ran
    record_finished(ran)
    record_spec(ran)
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "this spec names 4 of its finished runs" in result.output and "seeds=" in result.output
    assert "dapo-ablate report" in result.output and "Traceback" not in result.output
    assert not out.exists()


def results(seeds: int) -> pd.DataFrame:
    return pd.DataFrame([{"overlong_filter": a, "clip_higher": b, "seed": s, "avg@32": 0.3 + 0.05 * b + 0.01 * s + 0.02 * a * s,
                          "tokens_generated": 1, "tokens_discarded": 0, "wall_s": 1.0}
                         for a in (0, 1) for b in (0, 1) for s in range(seeds)])
