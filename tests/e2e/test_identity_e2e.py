"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_identity.py
describes; its docstring says what they check."""

from __future__ import annotations

import csv
import io
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.overrides import load_spec_with_overrides
from dapo_ablate.ablation.experiment.spec import ExperimentSpec, load_spec, run_root
from dapo_ablate.ablation.runtime import executor
from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.ablation.store.tracking import Tracker
from dapo_ablate.cli import run_cmd
from dapo_ablate.cli.main import app

from support import dapo_ablate
from test_identity import TRAINER, stores  # noqa: F401, F811 - shared with the fast part

OVERRIDES = ["trainer.schedule.total_steps=8"]


def identity_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    """A metric that tells the runs apart (0.1 OF + 0.2 CH + total_steps / 100), and whether the
    spec was recorded in the run's experiment folder before the run started."""
    techniques = config["techniques"]
    value = 0.1 * techniques["overlong_filter"] + 0.2 * techniques["clip_higher"] + config["schedule"]["total_steps"] / 100
    recorded = any((Path(run_dir).parent / name).is_file() for name in ("spec.yaml", "sweep.yaml"))
    return {
        "metrics": {"avg@4": value, "recorded": float(recorded)},
        "eval_curve": [{"step": 0, "avg@4": value}], "signals": [{"step": 1, "reward": 0.5}], "wall_s": 0.1,
    }


def invoke(argv: list[str], cwd: Path) -> Any:
    """A command in this process, as a user types it in the folder `cwd`."""
    before = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, argv)
    finally:
        os.chdir(before)


def follow(hint: str, cwd: Path) -> Any:
    """Run a printed command as a shell in `cwd`, the folder it was printed in, would split it (DIR:
    a new folder there): `run` and `sweep` as the real program, any other command in this process."""
    argv = [str(cwd / f"dir{len(list(cwd.iterdir()))}") if word == "DIR" else word for word in shlex.split(hint)]
    assert argv[0] == "dapo-ablate", hint
    if argv[1] in ("run", "sweep"):
        return dapo_ablate(*argv[1:], cwd=cwd, cell="test_identity_e2e:identity_cell")
    return invoke(argv[1:], cwd)


def hints(text: str) -> list[str]:
    """The commands a message names: each `dapo-ablate ...` between backticks, and after "Browse:"
    or "Report:"."""
    return re.findall(r"`(dapo-ablate [^`]+)`", text) + re.findall(r"(?:Browse|Report): (dapo-ablate .+)$", text, re.M)


def done_runs(spec: ExperimentSpec) -> dict[str, dict[str, Any]]:
    with SQLLedger(spec.ledger) as ledger:
        return {row["run_id"]: row for row in ledger.runs_table(spec.name) if row["status"] == "done"}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`ui SPEC k=v` before any run (its hint: the `run` to do first), that hint followed, and
    what it printed."""
    tmp_path = tmp_path_factory.mktemp("identity")
    spec_path = tmp_path / "mini.yaml"
    spec_path.write_text(yaml.safe_dump({"name": "mini", "trainer": TRAINER, "factors": ["overlong_filter", "clip_higher"],
                                         "seeds": 1, **stores(tmp_path / "out")}))
    before = invoke(["ui", "mini.yaml", *OVERRIDES], tmp_path)
    assert before.exit_code == 2, before.output
    (first,) = hints(before.stderr)
    assert first == f"dapo-ablate run mini.yaml {OVERRIDES[0]}"
    ran = follow(first + " --no-progress", tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    spec = load_spec_with_overrides(ExperimentSpec, spec_path, OVERRIDES, kind="spec")
    return {"path": spec_path, "spec": spec, "folder": run_root(spec), "stdout": ran.stdout, "tmp": tmp_path}


# -- the record ------------------------------------------------------------------------------------
def test_run_records_the_resolved_spec_in_the_experiment_folder_before_any_run(experiment: dict[str, Any]):
    spec, folder = experiment["spec"], experiment["folder"]
    record = folder / "spec.yaml"
    recorded = load_spec(record)
    assert recorded.trainer.schedule.total_steps == 8  # the override, applied
    assert [run.run_id for run in expand(recorded).runs] == [run.run_id for run in expand(spec).runs]
    assert recorded.ledger == f"sqlite:///{experiment['tmp']}/out/ledger.db" and Path(recorded.output_dir).is_absolute()
    assert sorted(p.name for p in folder.iterdir() if not p.is_dir()) == ["origin.json", "spec.yaml"]  # no temporary file left
    rows = done_runs(spec)
    assert len(rows) == 4 and {row["metrics"]["recorded"] for row in rows.values()} == {1.0}  # there before each run
    with SQLLedger(spec.ledger) as ledger:  # the ledger and the MLflow parent keep the same spec
        stored = ledger.get_experiment("mini")
    assert stored.spec["trainer"]["schedule"]["total_steps"] == 8
    tracker = Tracker(spec.tracking.uri, None, "mini")
    logged = tracker.client.download_artifacts(stored.mlflow_parent_run_id, "spec.json", str(experiment["tmp"]))
    assert yaml.safe_load(Path(logged).read_text())["trainer"]["schedule"]["total_steps"] == 8


# -- the round trip --------------------------------------------------------------------------------
def test_status_and_report_reach_the_same_runs_by_overrides_or_by_folder(experiment: dict[str, Any], tmp_path: Path):
    here = experiment["tmp"]
    for target in (["mini.yaml", *OVERRIDES], ["out/mini"], [str(experiment["folder"])]):
        shown = invoke(["status", *target], here)
        assert shown.exit_code == 0, shown.output
        assert "new 0  pending 0  running 0  done 4  failed 0" in shown.stdout
    cells = []
    for name, target in (("by-overrides", ["mini.yaml", *OVERRIDES]), ("by-folder", ["out/mini"])):
        made = invoke(["report", *target, "--out", str(tmp_path / name), "--format", "csv"], here)
        assert made.exit_code == 0, made.output
        cells.append((tmp_path / name / "cells.csv").read_text())
    assert cells[0] == cells[1]
    means = {row["cell"]: round(float(row["mean"]), 6) for row in csv.DictReader(io.StringIO(cells[0]))}
    assert means == {"baseline": 0.08, "OF": 0.18, "CH": 0.28, "OF+CH": 0.38}  # the runs with total_steps 8


def test_the_plain_spec_names_other_runs_and_says_how_to_reach_them(experiment: dict[str, Any], tmp_path: Path):
    here, out = experiment["tmp"], tmp_path / "plain"
    refused = invoke(["report", "mini.yaml", "--out", str(out)], here)
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.output
    assert "no finished runs under this spec" in refused.stderr and "trainer.schedule.total_steps=8" in refused.stderr
    assert not out.exists()
    shown = invoke(["status", "mini.yaml"], here)
    if shown.exit_code == 0:  # every run new, and a note
        assert "new 4" in shown.stdout and "none of these runs is in the ledger" in shown.stdout
    else:  # refused: the ledger binds the name to the recorded spec's design (store/binding.py)
        assert shown.exit_code == 2 and len(shown.stderr.strip().splitlines()) == 1, shown.output
        assert "holds other runs than this spec names" in shown.stderr
    followed = hints(refused.stderr) + hints(shown.output)
    assert sorted(followed) == sorted([  # the folder and the overrides, for report and for status
        "dapo-ablate report out/mini --out DIR", f"dapo-ablate report mini.yaml {OVERRIDES[0]} --out DIR",
        "dapo-ablate status out/mini", f"dapo-ablate status mini.yaml {OVERRIDES[0]}"])
    for hint in followed:
        result = follow(hint, here)
        assert result.exit_code == 0, (hint, result.output)
        assert "done 4" in result.stdout or "wrote" in result.stdout


# -- hints -----------------------------------------------------------------------------------------
def test_the_browse_hint_serves_the_store_the_runs_are_in(experiment: dict[str, Any], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    (browse,) = hints(experiment["stdout"])
    assert browse == "dapo-ablate ui out/mini"
    asked: list[list[str]] = []
    monkeypatch.setattr(run_cmd, "serve", lambda command, running=None: asked.append(command) or 0)
    result = follow(browse, experiment["tmp"])
    assert result.exit_code == 0, result.output
    assert asked[0][asked[0].index("--backend-store-uri") + 1] == f"sqlite:///{experiment['tmp']}/out/mlflow.db"


def test_a_sweeps_hints_run_as_printed(tmp_path: Path):
    sweep_path = tmp_path / "sweep.yaml"
    sweep_path.write_text(yaml.safe_dump({
        "name": "sw", "trainer": TRAINER, "space": {"eps_high": {"low": 0.2, "high": 0.5}}, "n_trials": 6,
        "sampler": {"type": "random", "seed": 3}, "pruner": "none", **stores(tmp_path / "out")}))
    before = invoke(["sweep-report", "sweep.yaml", "n_trials=2", "--out", "r"], tmp_path)
    assert before.exit_code == 2, before.output
    (first,) = hints(before.stderr)
    assert first == "dapo-ablate sweep sweep.yaml n_trials=2"
    ran = follow(first + " --no-progress", tmp_path)
    assert ran.returncode == 0 and "2/2 trials finished" in ran.stdout, ran.stderr[-3000:]
    (report,) = hints(ran.stdout)
    assert report == "dapo-ablate sweep-report out/sw --out DIR"
    made = follow(report, tmp_path)
    assert made.exit_code == 0 and "wrote" in made.stdout, made.output
    assert (tmp_path / "out" / "sw" / "sweep.yaml").is_file()


def test_a_folder_of_the_other_kind_names_the_command_that_reads_it(experiment: dict[str, Any], tmp_path: Path):
    here = experiment["tmp"]
    wrong = invoke(["sweep-report", "out/mini", "--out", str(tmp_path / "r")], here)
    assert wrong.exit_code == 2 and len(wrong.stderr.strip().splitlines()) == 1
    (hint,) = hints(wrong.stderr)
    assert hint == "dapo-ablate report out/mini --out DIR" and follow(hint, here).exit_code == 0
    above = invoke(["status", "out"], here)
    assert above.exit_code == 2 and above.stderr.rstrip().endswith("experiment folders in it: out/mini")


# -- a finished experiment's rerun -----------------------------------------------------------------
def test_rerunning_a_finished_experiment_starts_no_ray(experiment: dict[str, Any], monkeypatch: pytest.MonkeyPatch):
    def no_ray(*args: Any) -> bool:
        raise AssertionError("Ray was started for a finished experiment")

    monkeypatch.setattr(executor, "connect_ray", no_ray)
    monkeypatch.setenv(CELL_FN_ENV, "test_identity_e2e:identity_cell")
    spec = experiment["spec"]
    with SQLLedger(spec.ledger) as ledger:
        parent = ledger.get_experiment("mini").mlflow_parent_run_id
    client = Tracker(spec.tracking.uri, None, "mini").client
    client.set_terminated(parent, "KILLED")  # as a Ctrl-C after the last run was recorded leaves it
    again = invoke(["run", "mini.yaml", *OVERRIDES, "--no-progress"], experiment["tmp"])
    assert again.exit_code == 0, again.output
    assert "mini: 4/4 runs done (0 now, 4 before), 0 failed, 0 not finished" in again.stdout
    assert "All factors on (OF+CH) vs baseline (all factors off; SP, TL, DS on throughout)" in again.stdout  # as after the run
    assert client.get_run(parent).info.status == "FINISHED"


def test_a_finished_run_missing_from_mlflow_is_logged_by_the_rerun(experiment: dict[str, Any], tmp_path: Path):
    spec = experiment["spec"]
    plan = expand(spec)
    with SQLLedger(spec.ledger) as ledger:
        parent = ledger.get_experiment("mini").mlflow_parent_run_id
    tracker = Tracker(spec.tracking.uri, None, "mini")
    children = tracker.finished_children(parent)
    tracker.client.set_terminated(children[plan.runs[0].run_id], "FAILED")  # as if the driver died before logging it
    assert executor.rerun_finished(spec, plan, None) is None  # checked without Ray: not the quick way
    again = follow(f"dapo-ablate run mini.yaml {OVERRIDES[0]} --no-progress", experiment["tmp"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert {run.run_id for run in plan.runs} <= set(tracker.finished_children(parent))
