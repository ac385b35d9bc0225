"""One experiment, one answer: for each design (a full factorial with seeds, one seed per cell, a
resolution V fraction, an adaptive design, a transfer study), run through the real `dapo-ablate
run` with a stand-in cell that plants known effects, the supported claims are the same sentences,
with the same intervals, in every output: the end of `run`, `status` of the folder, the report's
console and summary (report.md, report.html), claims.csv (row i is sentence i: its term, estimate,
interval and adjusted p as printed), the MLflow parent run's tags and claims count, and, for the
transfer study, transfer.csv (the verdict lines, the counts and the transfer claims are its rows);
the headline is the same sentence everywhere and the parent's headline metrics are its numbers.

Observed or predicted: a cell the design did not run (the fraction's GRPO cell) is marked so in
the headline (console, status, report.md, the parent's tag), in the parent's
``headline/baseline_observed`` (0) and in cumulative.csv's ``observed`` column, checked against the
cells the ledger ran; every other design says nothing is predicted. A one-seed transfer study at
the built-in task's noise cannot earn "transfers" at a 2 pp margin, and its outputs agree."""

from __future__ import annotations

import hashlib
import html
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from support import PLANTED, STAND_IN_CELL_TRAINER, count_call, rows, write_spec
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


def dapo_ablate(*argv: str, cwd: Path, cell: str = "support:planted_cell") -> subprocess.CompletedProcess:
    done = run_command(*argv, cwd=cwd, cell=cell)
    assert done.returncode == 0, f"dapo-ablate {' '.join(argv)}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return done


def console_answer(output: str) -> tuple[list[str], list[str]]:
    """(the headline lines, one per setting, the supported sentences) of the answer `run` and
    `status` print."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Supported by the data ("))
    sentences = [line[4:] for line in lines[start + 1:] if line.startswith("  - ")]
    headlines = [line for line in lines[:start] if " vs " in line and (" pp [" in line or "not estimable" in line)]
    return headlines, sentences


def console_sections(output: str) -> dict[str, list[str]]:
    """The sections `report` echoes ("Heading:" then "  - line" items); the empty "Supported by the
    data" item ("None: ...") is left out, as report.md prints it outside the list."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith("  - ") and current is not None:
            sections[current].append(line[4:])
        elif line.endswith(":") and not line.startswith(" "):
            current = line[:-1]
            sections[current] = []
        else:
            current = None
    sections["Supported by the data"] = [line for line in sections.get("Supported by the data", [])
                                         if not line.startswith("None: ")]  # fmt: skip
    return sections


def page_section(text: str, heading: str) -> list[str]:
    """The bullet lines of one summary section of report.md, unescaped."""
    body = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [re.sub(r"\\(.)", r"\1", line[2:]) for line in body.splitlines() if line.startswith("- ")]


def html_section(text: str, heading: str) -> list[str]:
    body = text.split(f">{heading}</h2>", 1)[1].split("<h2", 1)[0]
    return [html.unescape(re.sub(r"<[^>]+>", "", item)).strip() for item in re.findall(r"<li>(.*?)</li>", body, re.S)]


def parent_run(spec: dict[str, Any], root: Path) -> Any:
    """The experiment's MLflow parent run."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root}/out/mlflow.db")
    experiment = client.get_experiment_by_name(spec["name"])
    parents = [run for run in client.search_runs([experiment.experiment_id]) if run.data.tags.get("dapo.role") == "parent"]
    assert len(parents) == 1
    return parents[0]


# -- what each output must say, derived from the files and the ledger, not from the code that wrote them --
LABELS = {"overlong_filter": "OF", "clip_higher": "CH", "soft_overlong": "SP", "token_level_loss": "TL",
          "dynamic_sampling": "DS"}  # fmt: skip


def label(term: str) -> str:
    """A term as the sentences name it: ``clip_higher:dynamic_sampling`` -> ``CH:DS``."""
    return ":".join(LABELS[factor] for factor in term.split(":"))


def pp(value: float) -> str:
    return f"{100 * value:+.1f} pp"


def ci(low: float, high: float) -> str:
    return f"[{100 * low:.1f}, {100 * high:.1f}]"


def assert_rows_are_the_sentences(claims: pd.DataFrame, sentences: list[str]) -> None:
    """claims.csv row i is "Supported by the data" sentence i: its setting, its term, its estimate and
    interval rounded as printed, and its adjusted p (an adaptive design's: the look that decided it)."""
    assert len(claims) == len(sentences), (claims, sentences)
    for row, sentence in zip(claims.itertuples(index=False), sentences):
        setting = getattr(row, "setting", "all")
        assert sentence.startswith(f"In {setting}: ") if setting != "all" else not sentence.startswith("In "), sentence
        if row.kind == "transfer":  # "<statistic> <term> (<setting a> - <setting b>)"
            name, pair = row.term.split(" ", 1)[1].rsplit(" (", 1)
            words = [label(name), pair.rstrip(")")]
        else:
            words = [label(row.term)]
        words += [f"{pp(row.estimate)} {ci(row.ci_low, row.ci_high)}"]
        words += [f"adjusted {row.p_adjusted:.2g}" if np.isfinite(row.p_adjusted) else f"by {row.family}"]
        for word in words:
            assert re.search(rf"(^|[\s(]){re.escape(word)}([\s:;,.)]|$)", sentence), (word, sentence)


def cells_run(spec_path: Path) -> dict[str, set[frozenset[str]]]:
    """Setting ("" without settings) -> the cells the ledger ran, each as the set of factors on."""
    from dapo_ablate.ablation.experiment.spec import load_spec

    ran: dict[str, set[frozenset[str]]] = {}
    for row in rows(load_spec(spec_path)).values():
        setting = row["cell_key"].split("/", 1)[0] if "/" in row["cell_key"] else ""
        ran.setdefault(setting, set()).add(frozenset(f for f, level in row["factors"].items() if level))
    return ran


def assert_headline_marks_what_was_run(line: str, metrics: dict[str, float], prefix: str,
                                       ran: set[frozenset[str]], factors: list[str]) -> None:
    """The headline's numbers are the parent's metrics under `prefix`, as printed; a full or baseline
    cell the ledger never ran is PREDICTED in the sentence and 0 in ``*_observed``."""
    def value(key: str) -> float:
        return metrics[prefix + key]

    p_value = f", p = {value('p_value'):.2g}" if np.isfinite(value("p_value")) else ""
    assert (f": {pp(value('full_vs_baseline'))} {ci(value('ci_low'), value('ci_high'))} (95% CI{p_value}); "
            f"avg@32 {100 * value('full'):.1f} vs {100 * value('baseline'):.1f}") in line, line
    full_run, baseline_run = frozenset(factors) in ran, frozenset() in ran
    assert (value("full_observed"), value("baseline_observed")) == (float(full_run), float(baseline_run))
    full_name, baseline_name = line.split(": ", 1)[0].split(" vs ")
    predicted = [name for name, seen in ((full_name[0].lower() + full_name[1:], full_run), (baseline_name, baseline_run))
                 if not seen]  # fmt: skip
    if predicted:
        assert f"PREDICTED: {' and '.join(predicted)} not run, its mean is the fitted model's prediction." in line, line
    else:
        assert "PREDICTED" not in line, line


def assert_cumulative_marks_what_was_run(cumulative: pd.DataFrame, ran: dict[str, set[frozenset[str]]]) -> None:
    """cumulative.csv's ``observed`` is True exactly where the ledger ran the step's cell."""
    by_setting = cumulative.groupby("setting", sort=False) if "setting" in cumulative else [("", cumulative)]
    for setting, table in by_setting:
        for _, path in table.groupby("ordering", sort=False):
            cells = [frozenset(path["added"].iloc[1:step + 1]) for step in range(len(path))]
            assert path["observed"].astype(bool).tolist() == [cell in ran[setting] for cell in cells], (setting, path)


STATISTICS = {"Shapley value": "shapley", "main effect": "main", "interaction": "interaction"}


def assert_transfer_agrees(console: dict[str, list[str]], report_md: str, claims: pd.DataFrame,
                           transfer: pd.DataFrame) -> None:
    """A transfer report's console, report.md, claims.csv and transfer.csv say the same thing: one
    verdict line per term of transfer.csv (its verdict, each setting's estimate and interval), the
    counts of inconclusive and transferring terms, and the transfer rows of claims.csv are exactly
    the terms transfer.csv says differ or flip."""
    for heading in ("Transfer verdicts", "Not supported by the data"):
        assert console[heading] == page_section(report_md, heading), heading
    lines = console["Transfer verdicts"]
    assert lines[0].startswith("Detectable difference: "), lines[0]  # the transfer answer leads with it
    terms = transfer.drop_duplicates(["statistic", "term"])
    for value, statistic in re.findall(r"([\d.]+(?: pp)?(?: to [\d.]+)?) pp in an? (Shapley value|main effect|interaction)", lines[0]):
        found = terms.loc[terms["statistic"] == STATISTICS[statistic], "detectable_difference"]
        low, high = f"{100 * found.min():.1f}", f"{100 * found.max():.1f}"
        assert value == (low if low == high else f"{low} pp to {high}"), (lines[0], statistic)
    shown = {}
    for line in lines[1:]:
        found = re.fullmatch(r"(\S+) \((Shapley value|main effect|interaction)\): ([a-z ]+)\. (.*)", line)
        assert found, line
        shown[(STATISTICS[found[2]], found[1])] = (found[3], found[4])
    statistics = {statistic for statistic, _ in shown}
    assert len(statistics & {"shapley", "main"}) == 1 and ("interaction" in statistics) == ("interaction" in set(terms["statistic"]))
    for term in terms[terms["statistic"].isin(statistics)].itertuples(index=False):
        verdict, rest = shown.pop((term.statistic, label(term.term)))
        assert verdict == term.verdict, (term.term, verdict, term.verdict)
        for row in transfer[(transfer["statistic"] == term.statistic) & (transfer["term"] == term.term)].itertuples():
            assert f"{row.setting} {pp(row.estimate)} {ci(row.ci_low, row.ci_high)}" in rest, (row, rest)
    assert not shown, shown  # no verdict line without its transfer.csv rows
    counts = terms["verdict"].value_counts()
    said = " ".join(console["Not supported by the data"])
    for verdict, words in (("inconclusive", "terms are inconclusive"), ("transfers", "terms transfer:")):
        n = int(counts.get(verdict, 0))
        assert (f"{n} of {len(terms)} {words}" in said) if n else (words not in said), (verdict, said)
    across = claims[claims["setting"] == "all"]
    claimed = {tuple(term.rsplit(" (", 1)[0].split(" ", 1)): family for term, family in zip(across["term"], across["family"])}
    differ = {"flips sign": "flips", "differs in size": "transfer"}
    assert claimed == {(t.statistic, t.term): differ[t.verdict] for t in terms.itertuples() if t.verdict in differ}


@pytest.mark.parametrize("design", list(DESIGNS))
def test_every_output_gives_the_same_answer(design: str, tmp_path: Path):
    fields = {**DESIGNS[design], "name": f"answer-{design}", "trainer": STAND_IN_CELL_TRAINER,
              "executor": {"max_concurrent": 2, "lease_s": 600}}
    spec_path = write_spec(tmp_path, **fields)
    run = dapo_ablate("run", str(spec_path), "--no-progress", cwd=tmp_path)
    headlines, supported = console_answer(run.stdout)
    folder = tmp_path / "out" / fields["name"]

    status = dapo_ablate("status", str(folder), cwd=tmp_path)
    assert console_answer(status.stdout) == (headlines, supported)

    report = dapo_ablate("report", str(folder), "--out", str(tmp_path / "report"), cwd=tmp_path)
    report_md = (tmp_path / "report" / "report.md").read_text()
    console = console_sections(report.stdout)
    assert page_section(report_md, "Supported by the data") == supported == console["Supported by the data"]
    assert html_section((tmp_path / "report" / "report.html").read_text(), "Supported by the data") == supported
    claims = pd.read_csv(tmp_path / "report" / "claims.csv")
    assert_rows_are_the_sentences(claims, supported)  # the same terms, estimates, intervals and p as printed

    parent = parent_run(fields, tmp_path)
    tags, metrics = parent.data.tags, parent.data.metrics
    assert tags["dapo.claims"] == (" | ".join(supported) or "none")
    assert metrics["claims/count"] == len(claims)
    settings = [item["name"] for item in fields.get("settings", [])] or [""]
    assert len(headlines) == len(settings)
    shown = page_section(report_md, "Headline")
    assert headlines == shown[:len(settings)] == console["Headline"][:len(settings)]
    ran = cells_run(spec_path)
    for setting, line in zip(settings, headlines):
        sentence = line.removeprefix(f"{setting}: ") if setting else line
        assert tags[f"dapo.headline.{setting}" if setting else "dapo.headline"] == sentence
        assert_headline_marks_what_was_run(sentence, metrics, f"headline/{setting}/" if setting else "headline/", ran[setting],
                                           fields["factors"])  # fmt: skip
    assert_cumulative_marks_what_was_run(pd.read_csv(tmp_path / "report" / "cumulative.csv"), ran)
    if design == "fraction":  # the half run lacks GRPO: every output says its mean is predicted
        assert frozenset() not in ran[""] and "PREDICTED: GRPO not run" in headlines[0]
        assert metrics["headline/baseline_observed"] == 0
        assert not pd.read_csv(tmp_path / "report" / "cumulative.csv")["observed"].all()
    if design == "transfer":
        assert_transfer_agrees(console, report_md, claims, pd.read_csv(tmp_path / "report" / "transfer.csv"))

    assert any("DS" in sentence for sentence in supported), supported  # the planted 8 pp effect is found
    if design == "adaptive":  # its looks decide: the report leads with them, and says so once
        headings = [part.split("\n", 1)[0] for part in report_md.split("\n## ")[1:]]
        assert headings[:4] == ["What produced it", "Headline", "Looks", "Design"], headings
        assert report_md.count("Looks of the adaptive design") <= 1
        assert "adaptive looks" in tags["dapo.claims.rule"]


def noisy_setting_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """`support.planted_cell`'s effects, the same in every setting, with run noise of the built-in
    task's size: uniform within +-3.5 pp (sd 2 pp), drawn from (techniques, seed, setting's rollout)."""
    count_call(run_dir)
    techniques = config["techniques"]
    blob = json.dumps([sorted(techniques.items()), config["schedule"]["seed"], config["rollout"]], sort_keys=True)
    noise = (int(hashlib.sha256(blob.encode()).hexdigest()[:8], 16) / 16**8 - 0.5) * 0.07
    accuracy = 0.40 + sum(effect for name, effect in PLANTED.items() if techniques.get(name)) + noise
    return {"metrics": {"avg@32": accuracy}, "eval_curve": [{"step": 0, "avg@32": 0.40}, {"step": 2, "avg@32": accuracy}],
            "signals": [{"step": 1, "reward": 0.0}], "tokens_generated": 100, "tokens_discarded": 0, "wall_s": 0.1}


def test_one_seed_cannot_transfer_at_two_pp_and_every_output_agrees(tmp_path: Path):
    """examples/transfer.yaml's shape (three settings, DAPO's five techniques in the resolution V half
    fraction, one seed per cell) with the same planted effects in every setting and the built-in
    task's noise: no term "transfers" at the default 2 pp margin, because for every term even a zero
    difference between two settings has a 90% interval wider than +-2 pp (recomputed from
    transfer.csv's own se and df); the verdict is that TOST. The end of `run`, the report's console,
    report.md, claims.csv and transfer.csv give the same claims, verdicts and counts."""
    from test_transfer import (
        _equivalence,  # here, not at the top: Ray's workers import this module for its cell
    )

    settings = [{"name": "s64", "overrides": {}}, {"name": "s48", "overrides": {"rollout.max_response_len": 48}},
                {"name": "s32", "overrides": {"rollout.max_response_len": 32}}]  # fmt: skip
    fields = {"name": "one-seed-transfer", "factors": FIVE, "design": "fractional", "resolution": "V", "seeds": 1,
              "settings": settings, "executor": {"max_concurrent": 2, "lease_s": 600}}  # fmt: skip
    spec_path = write_spec(tmp_path, **fields)
    cell = "test_one_answer_e2e:noisy_setting_cell"
    run = dapo_ablate("run", str(spec_path), "--no-progress", cwd=tmp_path, cell=cell)
    headlines, supported = console_answer(run.stdout)
    report = dapo_ablate("report", str(tmp_path / "out" / fields["name"]), "--out", str(tmp_path / "report"),
                         cwd=tmp_path, cell=cell)  # fmt: skip
    report_md = (tmp_path / "report" / "report.md").read_text()
    console = console_sections(report.stdout)
    transfer = pd.read_csv(tmp_path / "report" / "transfer.csv")
    claims = pd.read_csv(tmp_path / "report" / "claims.csv")

    assert set(transfer["df"].round(6)) == {5.0}  # each setting's own Lenth PSE over its 15 effects (m / 3 df)
    for (statistic, term), term_rows in transfer.groupby(["statistic", "term"], sort=False):
        far, floor = _equivalence(term_rows)
        head = term_rows.iloc[0]
        assert head["excluded_beyond"] == pytest.approx(far)
        assert floor > 0.02, (statistic, term, floor)  # out of reach, whatever the estimates
        assert head["verdict"] != "transfers", (statistic, term)
    assert "transfers" not in set(transfer["verdict"])
    assert not any(": transfers." in line for line in console["Transfer verdicts"])

    assert len(headlines) == 3 and all("PREDICTED: GRPO not run" in line for line in headlines)  # each a half fraction
    assert console["Headline"] == headlines == page_section(report_md, "Headline")
    assert console["Supported by the data"] == supported == page_section(report_md, "Supported by the data")
    assert_rows_are_the_sentences(claims, supported)
    assert_transfer_agrees(console, report_md, claims, transfer)


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
