"""One experiment, one answer: for each design (a full factorial with seeds, one seed per cell, a
resolution V fraction, an adaptive design, a transfer study), run through the real `dapo-ablate
run` with a stand-in cell that plants known effects, the supported claims are the same sentences,
with the same intervals, in every output: the end of `run`, `status` of the folder, the report's
summary (report.md, report.html), claims.csv (one row per sentence) and the MLflow parent run's
tags; and the headline is the same sentence everywhere."""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from support import STAND_IN_CELL_TRAINER, write_spec
from support import dapo_ablate as run_command


THREE = ["overlong_filter", "clip_higher", "dynamic_sampling"]
FIVE = ["overlong_filter", "clip_higher", "soft_overlong", "token_level_loss", "dynamic_sampling"]

DESIGNS = {
    "seeds": {"factors": THREE, "seeds": 3},
    "one-seed": {"factors": FIVE, "seeds": 1},
    "fraction": {"factors": FIVE, "design": "fractional", "resolution": "V", "seeds": 2},
    "adaptive": {"factors": THREE, "design": "adaptive", "seeds": 2, "adaptive": {"max_seeds": 4}},
    "transfer": {"factors": ["clip_higher", "dynamic_sampling"], "seeds": 3,
                 "settings": [{"name": "short", "overrides": {}},
                              {"name": "long", "overrides": {"rollout.max_response_len": 48}}]},
}


def dapo_ablate(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    done = run_command(*argv, cwd=cwd, cell="support:planted_cell")
    assert done.returncode == 0, f"dapo-ablate {' '.join(argv)}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return done


def console_answer(output: str) -> tuple[str, list[str]]:
    """(the headline line, the supported sentences) of the answer `run` and `status` print."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Supported by the data ("))
    sentences = [line[4:] for line in lines[start + 1:] if line.startswith("  - ")]
    headline = next(line for line in lines if " vs " in line and "pp [" in line)
    return headline, sentences


def page_section(text: str, heading: str) -> list[str]:
    """The bullet lines of one summary section of report.md, unescaped."""
    body = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [re.sub(r"\\(.)", r"\1", line[2:]) for line in body.splitlines() if line.startswith("- ")]


def html_section(text: str, heading: str) -> list[str]:
    body = text.split(f">{heading}</h2>", 1)[1].split("<h2", 1)[0]
    return [html.unescape(re.sub(r"<[^>]+>", "", item)).strip() for item in re.findall(r"<li>(.*?)</li>", body, re.S)]


def parent_tags(spec: dict[str, Any], root: Path) -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root}/out/mlflow.db")
    experiment = client.get_experiment_by_name(spec["name"])
    parents = [run for run in client.search_runs([experiment.experiment_id]) if run.data.tags.get("dapo.role") == "parent"]
    assert len(parents) == 1
    return parents[0].data.tags


@pytest.mark.parametrize("design", list(DESIGNS))
def test_every_output_gives_the_same_answer(design: str, tmp_path: Path):
    fields = {**DESIGNS[design], "name": f"answer-{design}", "trainer": STAND_IN_CELL_TRAINER,
              "executor": {"max_concurrent": 2, "lease_s": 600}}
    spec_path = write_spec(tmp_path, **fields)
    run = dapo_ablate("run", str(spec_path), "--no-progress", cwd=tmp_path)
    headline, supported = console_answer(run.stdout)
    folder = tmp_path / "out" / fields["name"]

    status = dapo_ablate("status", str(folder), cwd=tmp_path)
    assert console_answer(status.stdout) == (headline, supported)

    dapo_ablate("report", str(folder), "--out", str(tmp_path / "report"), cwd=tmp_path)
    report_md = (tmp_path / "report" / "report.md").read_text()
    assert page_section(report_md, "Supported by the data") == supported
    assert html_section((tmp_path / "report" / "report.html").read_text(), "Supported by the data") == supported
    claims = pd.read_csv(tmp_path / "report" / "claims.csv")
    assert len(claims) == len(supported)

    tags = parent_tags(fields, tmp_path)
    assert tags["dapo.claims"] == (" | ".join(supported) or "none")
    shown = [line.split(": ", 1)[1] if design == "transfer" else line for line in page_section(report_md, "Headline")]
    assert headline.split(": ", 1)[-1] in shown or headline in shown
    if design == "transfer":
        assert any(tags[f"dapo.headline.{name}"] in headline for name in ("short", "long"))
    else:
        assert tags["dapo.headline"] == headline

    assert any("DS" in sentence for sentence in supported), supported  # the planted 8 pp effect is found
    if design == "adaptive":  # its looks decide: the report leads with them, and says so once
        headings = [part.split("\n", 1)[0] for part in report_md.split("\n## ")[1:]]
        assert headings[:4] == ["What produced it", "Headline", "Looks", "Design"], headings
        assert report_md.count("Looks of the adaptive design") <= 1
        assert "adaptive looks" in tags["dapo.claims.rule"]


def test_a_report_opens_with_what_produced_it(tmp_path: Path):
    """A run made with an override of a trainer file, factors OF and CH with TL held on in the base:
    the report opens with the experiment, the command and its override as a difference from the
    base file, what is held on, the stores and the versions; the baseline is named by what is on;
    the report folder holds the resolved spec."""
    import yaml

    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**STAND_IN_CELL_TRAINER, "techniques": {"soft_overlong": False, "dynamic_sampling": False}}))
    spec_path = write_spec(tmp_path, name="made-of", trainer="base.yaml", factors=["overlong_filter", "clip_higher"],
                           seeds=2, executor={"max_concurrent": 2, "lease_s": 600})
    run = dapo_ablate("run", str(spec_path), "trainer.algorithm.eps_high=0.31", "--no-progress", cwd=tmp_path)
    assert "baseline (all factors off; TL on throughout)" in run.stdout
    folder = tmp_path / "out" / "made-of"
    dapo_ablate("report", str(folder), "--out", str(tmp_path / "report"), cwd=tmp_path)
    report_md = (tmp_path / "report" / "report.md").read_text()
    assert report_md.split("\n## ")[1].startswith("What produced it")
    produced = " ".join(page_section(report_md, "What produced it"))
    for words in ("Experiment made-of: full design over 2 factors, seeds 0, 1; 8 of 8 planned runs done",
                  "trainer.algorithm.eps_high=0.31", f"differs from its base file {tmp_path / 'base.yaml'}",
                  "algorithm.eps_high 0.28 -> 0.31", "Held on in every run (not factors, from the base config): TL",
                  f"ledger sqlite:///{tmp_path}/out/ledger.db", "Versions: dapo-ablate ", "report made 20"):
        assert words in produced, (words, produced)
    assert "baseline (all factors off; TL on throughout)" in " ".join(page_section(report_md, "Headline"))
    recorded = yaml.safe_load((tmp_path / "report" / "spec.yaml").read_text())
    assert recorded["trainer"]["algorithm"]["eps_high"] == 0.31 and recorded["name"] == "made-of"
