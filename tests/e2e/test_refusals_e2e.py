"""A refused command writes nothing: after a finished experiment (the real `dapo-ablate run`, a
stand-in cell function), every refusal of `run`, `run --dry-run`, `validate`, `status`, `report`,
`sweep` and `train` exits 2 with one sentence and leaves every file of the project byte-identical:
the experiment folder's recorded spec above all, which is the folder's identity (an earlier
version's refused `run` rewrote it, and from then on `status` and `report` of the folder failed).
A folder damaged that way is restored from the ledger's record by the next command that reads it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from dapo_ablate.ablation.experiment.overrides import load_spec_with_overrides
from dapo_ablate.ablation.experiment.spec import ExperimentSpec
from dapo_ablate.ablation.runtime.executor import record_spec

from support import STAND_IN_CELL_TRAINER, dapo_ablate, write_spec

SQLITE_TRANSIENTS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a database while any connection, a reader's too, has it open
(empty or a copy of pages already in the file): not content, so not compared."""


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (links as their target's text): relative path -> sha256 of its bytes."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.name.endswith(SQLITE_TRANSIENTS):
            continue
        if path.is_symlink():
            found[str(path.relative_to(root))] = "link:" + os.readlink(path)
        elif path.is_file():
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("refusals")
    spec_path = write_spec(root, name="refusals")
    done = dapo_ablate("run", str(spec_path), "--no-progress", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    folder = root / "out" / "refusals"
    assert (folder / "spec.yaml").is_file()
    return {"root": root, "spec": spec_path, "folder": folder}


def refused(finished: dict[str, Any], *argv: str, says: str) -> str:
    """Run `argv` in the project; assert exit 2, one sentence containing `says`, and no file changed."""
    root = finished["root"]
    before = snapshot(root)
    done = dapo_ablate(*argv, cwd=root)
    assert done.returncode == 2, done.stdout + done.stderr
    error = done.stderr.strip()
    assert says in error and error.count("\n") == 0, error
    assert snapshot(root) == before, f"`dapo-ablate {' '.join(argv)}` changed files"
    return error


ANOTHER_DESIGN = "trainer.algorithm.eps_high=0.3"


@pytest.mark.parametrize("argv", [
    ("run", "{spec}", ANOTHER_DESIGN, "--no-progress"),
    ("run", "{folder}", ANOTHER_DESIGN, "--no-progress"),
    ("run", "{spec}", ANOTHER_DESIGN, "--dry-run"),
    ("validate", "{spec}", ANOTHER_DESIGN),
    ("status", "{folder}", ANOTHER_DESIGN),
    ("report", "{folder}", ANOTHER_DESIGN, "--out", "{root}/report"),
], ids=["run", "run-folder", "dry-run", "validate", "status", "report"])
def test_a_spec_the_names_binding_refuses_changes_no_file(finished: dict[str, Any], argv: tuple[str, ...]):
    words = [word.format(**finished) for word in argv]
    refused(finished, *words, says="already has an experiment named 'refusals' made from another spec")
    record = yaml.safe_load((finished["folder"] / "spec.yaml").read_text())
    assert record["trainer"]["algorithm"]["eps_high"] != 0.3
    status = dapo_ablate("status", str(finished["folder"]), cwd=finished["root"])  # the folder still reads
    assert status.returncode == 0, status.stderr


@pytest.mark.parametrize("argv, says", [
    (("run", "{spec}", "trainer.algorithm.eps_hihg=0.3"), "did you mean"),
    (("run", "{spec}", "seeds=-1"), "seeds"),
    (("run", "{spec}", "--address", "127.0.0.1:1"), "127.0.0.1:1"),
    (("report", "{folder}", "--out", "{root}/report", "--adjust", "nope"), "nope"),
    (("report", "{folder}", "--out", "{spec}"), "--out"),
    (("train", "{root}/trainer.yaml", "--out", "{folder}/{run_id}"), "another config"),
], ids=["unknown-key", "bad-value", "address", "bad-option", "out-is-a-file", "train-over-a-run"])
def test_every_other_refusal_changes_no_file(finished: dict[str, Any], argv: tuple[str, ...], says: str):
    root = finished["root"]
    (root / "trainer.yaml").write_text(yaml.safe_dump({**STAND_IN_CELL_TRAINER, "schedule": {"total_steps": 2}}))
    run_id = next(path.name for path in finished["folder"].iterdir() if path.is_dir())
    (finished["folder"] / run_id / "result.json").write_text('{"config": {"schedule": {"total_steps": 9}}}')
    words = [word.format(**finished, run_id=run_id) for word in argv]
    refused(finished, *words, says=says)


def test_a_sweep_resumed_with_another_space_changes_no_file(tmp_path: Path):
    sweep = {"name": "refused-sweep", "trainer": STAND_IN_CELL_TRAINER, "n_trials": 1, "metric": "avg@32",
             "space": {"eps_high": {"low": 0.2, "high": 0.3}}, "output_dir": str(tmp_path / "out"),
             "ledger": f"sqlite:///{tmp_path}/out/ledger.db", "tracking": {"uri": f"sqlite:///{tmp_path}/out/mlflow.db"}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    done = dapo_ablate("sweep", str(path), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    before = snapshot(tmp_path)
    again = dapo_ablate("sweep", str(path), "space.eps_high.high=0.5", "--no-progress", cwd=tmp_path)
    assert again.returncode == 2, again.stdout + again.stderr
    assert snapshot(tmp_path) == before


def test_a_record_an_earlier_version_rewrote_is_restored_from_the_ledger(finished: dict[str, Any]):
    folder = finished["folder"]
    record = folder / "spec.yaml"
    original = record.read_bytes()
    record_spec(load_spec_with_overrides(ExperimentSpec, finished["spec"], [ANOTHER_DESIGN], kind="spec"))  # as 0.1 did
    assert record.read_bytes() != original
    status = dapo_ablate("status", str(folder), cwd=finished["root"])
    assert status.returncode == 0, status.stderr
    assert "restored it from the ledger's record" in status.stderr
    assert record.read_bytes() == original


def test_a_ledger_run_cannot_read_is_refused_by_the_dry_run_too(tmp_path: Path):
    """A dry run refuses what `run` refuses: a ledger whose runs table lost a column (a hand-made
    or damaged database) is the same sentence and exit 2 from both, not "all runs to do"."""
    import sqlite3

    spec_path = write_spec(tmp_path, name="damaged")
    assert dapo_ablate("run", str(spec_path), "--no-progress", cwd=tmp_path).returncode == 0
    db = sqlite3.connect(tmp_path / "out" / "ledger.db")
    with db:
        db.execute("ALTER TABLE runs DROP COLUMN job_id")
    db.close()  # the last connection: its write-ahead log checkpointed into the file
    before = snapshot(tmp_path)
    answers = [dapo_ablate(*argv, cwd=tmp_path) for argv in (("run", str(spec_path), "--dry-run"),
                                                            ("validate", str(spec_path)),
                                                            ("run", str(spec_path), "--no-progress"))]
    for done in answers:
        assert done.returncode == 2 and "no such column: runs.job_id" in done.stderr, done.stdout + done.stderr
    assert snapshot(tmp_path) == before
