"""Confirm mode of an adaptive design through the real `dapo-ablate run`: a spec with `design:
adaptive` and `confirm:` watches only the predicted terms, stops once they are decided, and every
output (the end of `run`, `status`, the report's console, report.md, claims.csv, confirmation.csv,
the MLflow parent run's tags) says the same verdicts. The stand-in cell plants +8 pp for Dynamic
Sampling and +3 pp for Clip-Higher (`support.PLANTED`); the predictions say Dynamic Sampling helps
(confirmed), Clip-Higher hurts (a flip: contradicted) and Overlong Filtering does nothing (a null,
confirmed once its interval lies within the effect of interest)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from support import STAND_IN_CELL_TRAINER, rows, write_spec
from test_one_answer_e2e import (
    assert_rows_are_the_sentences,
    console_sections,
    dapo_ablate,
    label,
    page_section,
    parent_run,
)  # fmt: skip

THREE = ["overlong_filter", "clip_higher", "dynamic_sampling"]
PREDICTED = {  # term: (direction, estimate, ci_low, ci_high), as a small model's report would write them
    "dynamic_sampling": ("positive", 0.05, 0.02, 0.08),
    "clip_higher": ("negative", -0.02, -0.035, -0.005),
    "overlong_filter": ("zero", 0.003, -0.015, 0.021),
    "clip_higher:dynamic_sampling": ("positive", 0.03, 0.01, 0.05),  # predicted, not watched (not in confirm.terms)
}
WATCHED = ["overlong_filter", "clip_higher", "dynamic_sampling"]
VERDICTS = {"dynamic_sampling": "confirmed", "clip_higher": "contradicted", "overlong_filter": "confirmed"}


def write_predictions(path: Path) -> None:
    entries = [{"statistic": "interaction" if ":" in term else "main", "term": term, "direction": direction,
                "estimate": estimate, "ci_low": low, "ci_high": high, "se": (high - low) / 3.92, "df": 12.0,
                "from_setting": {"name": "small", "model_family": "builtin", "model_size": "small"}, "for_setting": {}}
               for term, (direction, estimate, low, high) in PREDICTED.items()]  # fmt: skip
    path.write_text(yaml.safe_dump({"format": "dapo-ablate predictions 1", "metric": "avg@32", "confidence": 0.95,
                                    "predictions": entries}, sort_keys=False))  # fmt: skip


def lines_after(output: str, heading: str) -> list[str]:
    """The "  - " items right after the console line that starts with ``heading``."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    found = []
    for line in lines[start + 1:]:
        if not line.startswith("  - "):
            break
        found.append(line[4:])
    return found


def test_confirm_mode_watches_the_predicted_terms_stops_when_decided_and_every_output_agrees(tmp_path: Path):
    write_predictions(tmp_path / "predictions.yaml")
    fields = {"name": "confirm-adaptive", "trainer": STAND_IN_CELL_TRAINER, "factors": THREE, "design": "adaptive",
              "seeds": 2, "adaptive": {"max_seeds": 6, "effect_of_interest": 3.0, "spending": "pocock"},
              "confirm": {"predictions": "predictions.yaml", "terms": WATCHED},
              "executor": {"max_concurrent": 2, "lease_s": 600}}  # fmt: skip
    spec_path = write_spec(tmp_path, **fields)
    run = dapo_ablate("run", str(spec_path), "--no-progress", cwd=tmp_path)
    supported = lines_after(run.stdout, "Supported by the data (")
    verdicts = lines_after(run.stdout, "Predictions confirmed (confirm mode):")
    folder = tmp_path / "out" / fields["name"]

    # it watched the three named terms only, and stopped at the first look that decided them all
    from dapo_ablate.ablation.experiment.spec import load_spec
    from dapo_ablate.ablation.store.ledger import SQLLedger

    spec = load_spec(spec_path)
    with SQLLedger(spec.ledger) as ledger:
        looks = ledger.looks(spec.name)
    last = looks[-1]
    assert last["watch"] == WATCHED and all(look["watch"] == WATCHED for look in looks)
    for number in range(1, len(looks) + 1):  # each look said once, whichever listeners hear the note
        assert run.stdout.count(f"{spec.name}: look {number}: ") == 1, run.stdout
    decisions = {row["term"]: row["decision"] for row in last["terms"]}
    assert {term for term, d in decisions.items() if d != "not watched"} == set(WATCHED)
    assert decisions["clip_higher:dynamic_sampling"] == "not watched"  # predicted, not in confirm.terms
    assert all(decisions[term] in ("supported", "not supported") for term in WATCHED)
    assert last["stopped"] and last["reason"] == "every watched term is decided"
    earlier = [{row["term"]: row["decision"] for row in look["terms"]} for look in looks[:-1]]
    assert all(any(d[term] == "undecided" for term in WATCHED) for d in earlier)  # no look decided them sooner
    assert len(rows(spec)) == last["runs"] < 8 * 6  # stopped before the budget

    # the same verdicts in every output
    assert [line.rsplit(": ", 1)[1].rstrip(".") for line in verdicts[:-1]] == [VERDICTS[t] for t in WATCHED]
    status = dapo_ablate("status", str(folder), cwd=tmp_path)
    assert lines_after(status.stdout, "Supported by the data (") == supported
    assert lines_after(status.stdout, "Predictions confirmed (confirm mode):") == verdicts
    assert "confirm mode: watching only the predicted overlong_filter, clip_higher, dynamic_sampling" in status.stdout

    out = tmp_path / "report"
    report = dapo_ablate("report", str(folder), "--out", str(out), cwd=tmp_path)
    report_md = (out / "report.md").read_text()
    console = console_sections(report.stdout)
    assert console["Predictions confirmed"][:len(verdicts)] == verdicts
    assert page_section(report_md, "Predictions confirmed")[:len(verdicts)] == verdicts
    confirmation = pd.read_csv(out / "confirmation.csv")
    assert list(confirmation["term"]) == WATCHED and list(confirmation["verdict"]) == [VERDICTS[t] for t in WATCHED]
    for row, line in zip(confirmation.itertuples(index=False), verdicts):
        assert f" {label(row.term)} " in line and f"[{100 * row.ci_low:.1f}, {100 * row.ci_high:.1f}]" in line, line
    assert page_section(report_md, "Supported by the data") == supported == console["Supported by the data"]
    claims = pd.read_csv(out / "claims.csv")
    assert_rows_are_the_sentences(claims, supported)
    assert set(claims["term"]) == {"dynamic_sampling", "clip_higher"}  # a contradicted flip is still a supported effect

    tags = parent_run(fields, tmp_path).data.tags
    assert tags["dapo.confirm"] == " | ".join(verdicts)
    assert tags["dapo.claims"] == " | ".join(supported)
    assert "Confirm mode: only the 3 predicted terms were watched" in tags["dapo.claims.rule"]


def test_confirm_mode_is_checked_before_any_run(tmp_path: Path):
    """A predictions file that is not there, and a term it does not predict, are one sentence each
    from `validate` (exit 2); nothing runs."""
    fields = {"name": "confirm-bad", "trainer": STAND_IN_CELL_TRAINER, "factors": THREE, "design": "adaptive",
              "seeds": 2, "confirm": {"predictions": "missing.yaml"}}  # fmt: skip
    from support import dapo_ablate as run_command

    done = run_command("validate", str(write_spec(tmp_path, **fields)), cwd=tmp_path)
    assert done.returncode == 2 and "confirm.predictions" in done.stderr and "Traceback" not in done.stderr
    write_predictions(tmp_path / "predictions.yaml")
    fields["confirm"] = {"predictions": "predictions.yaml", "terms": ["soft_overlong"]}
    done = run_command("validate", str(write_spec(tmp_path, **fields)), cwd=tmp_path)
    assert done.returncode == 2 and "confirm.terms: 'soft_overlong'" in done.stderr, done.stderr
