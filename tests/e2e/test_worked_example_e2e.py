"""The README's worked example, predict on the small built-in policy and confirm on the large one
(examples/predict_small.yaml, examples/confirm_large.yaml), through its own commands on copies of
the example files, shrunk: a stand-in cell instead of training (support.planted_cell: +8 pp for
Dynamic Sampling, nothing for Soft Overlong Punishment), and the confirm spec run with
``trainer.model.builtin_size=small`` so the large policy's one-off warm-start (about 10 minutes) is
not part of the test. `validate` of the confirm spec refuses it until the first report has written
the predictions, then accepts it; `run` watches the two named terms only and says their verdicts, as
the report's confirmation.csv does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import yaml

from support import ROOT
from support import dapo_ablate as run_command

FILES = ("predict_small.yaml", "confirm_large.yaml", "dapo_cpu.yaml", "dapo_cpu_large.yaml")
CELL = "support:planted_cell"


def command(*argv: str, cwd: Path, code: int = 0):
    done = run_command(*argv, cwd=cwd, cell=CELL)
    assert done.returncode == code, f"dapo-ablate {' '.join(argv)}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return done


def test_predict_small_then_confirm_large_through_the_readme_commands(tmp_path: Path):
    examples = tmp_path / "examples"
    examples.mkdir()
    for name in FILES:
        shutil.copy(ROOT / "examples" / name, examples / name)
    small, large = "examples/predict_small.yaml", "examples/confirm_large.yaml"
    command("validate", small, cwd=tmp_path)
    refused = command("validate", large, cwd=tmp_path, code=2)
    assert "confirm.predictions" in refused.stderr and "report-small" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr

    command("run", small, "--no-progress", cwd=tmp_path)
    command("report", small, "--out", "dapo-runs/report-small/", cwd=tmp_path)
    predictions = tmp_path / "dapo-runs" / "report-small" / "predictions.yaml"
    written = yaml.safe_load(predictions.read_text())["predictions"]
    assert {p["from_setting"]["name"] for p in written} == {"dapo-small"}
    assert {p["from_setting"]["model_size"] for p in written} == {"small"}
    checked = command("validate", large, "trainer.model.builtin_size=small", cwd=tmp_path)
    watched = next(line for line in checked.stdout.splitlines() if line.startswith("confirm  "))
    assert "report-small/predictions.yaml: the looks watch only soft_overlong (predicted " in watched, watched
    assert watched.endswith("dynamic_sampling (predicted positive from dapo-small)"), watched  # the planted +8 pp

    run = command("run", large, "trainer.model.builtin_size=small", "--no-progress", cwd=tmp_path)
    lines = run.stdout.splitlines()
    start = lines.index("Predictions confirmed (confirm mode):")
    verdicts = [line[4:] for line in lines[start + 1:start + 4] if line.startswith("  - ")]
    assert len(verdicts) == 3 and verdicts[-1].startswith("Confirm mode: the looks watched only these 2")
    assert " SP (main effect) " in verdicts[0] and " DS (main effect) " in verdicts[1]
    assert verdicts[1].endswith(": confirmed.")  # the planted +8 pp, predicted positive from the small run

    command("report", large, "trainer.model.builtin_size=small", "--out", "dapo-runs/report-large/", cwd=tmp_path)
    confirmation = pd.read_csv(tmp_path / "dapo-runs" / "report-large" / "confirmation.csv")
    assert list(confirmation["term"]) == ["soft_overlong", "dynamic_sampling"]
    assert list(confirmation["from_setting"]) == ["dapo-small"] * 2
    for row, line in zip(confirmation.itertuples(index=False), verdicts):
        assert line.endswith(f": {row.verdict}."), (row, line)
