"""A link planted at any name the product writes under an experiment's output folder is never
written through: the class of probe, not a list of its members.

The names are found, not listed: one experiment's writes (its recorded spec and origin, its SQLite
lock, one real run of the built-in trainer with a checkpoint and the shared evaluation cache, the
kept result) are made twice in two fresh folders with Python's audit hooks recording every file
opened for writing, every folder made and every rename's target; the names both share (the
temporary names are random: mkstemp opens them O_EXCL) are the ones a hostile user could plant.
Then, for each name, in a fresh folder: a dangling link at a file's name (writing through it would
create its target) or a link to a full folder outside at a folder's name, the same writes again;
they must finish (the link replaced) or stop in a product error, and nothing outside may change.

A new file or folder the product writes is covered the day it is written; a write that follows a
link fails here (the SQLite ledger's lock file did, before it was opened with `atomic.open_lock`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.cell import run_cell
from dapo_ablate.ablation.runtime.executor import record_origin, record_spec
from dapo_ablate.ablation.runtime.jobs import SEAL_ENV
from dapo_ablate.ablation.runtime.pool import worker_key
from dapo_ablate.ablation.runtime.task import execute_run
from dapo_ablate.ablation.store.database import experiment_lock
from dapo_ablate.ablation.store.kept_results import ResultKeeper

from support import write_spec
from tiny_configs import TINY_TRAINER

ONE_STEP = {**TINY_TRAINER, "schedule": {"total_steps": 1, "eval_every": 1, "checkpoint_every": 1}}
"""One step of the built-in trainer, checkpointed and evaluated: every file a run writes, quickly."""

_recording: list[tuple[str, Path]] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Record writes while `_recording` is a list: (kind, path) of files opened to write, folders
    made and rename targets."""
    if _recording is None:
        return
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1] or "", args[2] or 0
        if any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            _recording.append(("file", Path(os.fsdecode(args[0]))))
    elif event == "os.mkdir":
        _recording.append(("folder", Path(os.fsdecode(args[0]))))
    elif event == "os.rename":
        _recording.append(("file", Path(os.fsdecode(args[1]))))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only inside `recorded`


def experiment_writes(root: Path) -> None:
    """What a `run` of a one-run experiment writes under its output folder, in order."""
    spec = load_spec(write_spec(root, name="links", trainer=ONE_STEP, factors=["clip_higher"]))
    record_spec(spec)
    record_origin(Path(spec.output_dir) / spec.name, {"command": "run"})
    with experiment_lock(spec.ledger, spec.name):
        pass
    run = expand(spec).runs[0]
    folder = Path(spec.output_dir) / spec.name
    result = execute_run(run_cell, run.config.to_dict(), str(folder / run.run_id), str(Path(spec.output_dir) / "eval-cache"))
    assert ResultKeeper(folder, b"k" * 32).keep(run.run_id, result)


def recorded(root: Path) -> dict[Path, str]:
    """The names under ``root/out`` that `experiment_writes` writes (relative), file or folder."""
    global _recording
    _recording = []
    try:
        experiment_writes(root)
    finally:
        found, _recording = _recording, None
    out = (root / "out").resolve()
    names: dict[Path, str] = {}
    for kind, path in found:
        full = (path if path.is_absolute() else Path.cwd() / path).resolve(strict=False)
        if out in full.parents:
            names.setdefault(full.relative_to(out), kind)
    return names


@pytest.fixture(scope="module")
def planted_names(tmp_path_factory) -> dict[Path, str]:
    os.environ[SEAL_ENV] = worker_key(b"k" * 32).hex()
    first, second = recorded(tmp_path_factory.mktemp("a")), recorded(tmp_path_factory.mktemp("b"))
    names = {name: kind for name, kind in first.items() if second.get(name) == kind}
    # what this test relies on having found: the spec record, the lock, a run's folder and its files, the cache
    suffixes = {name.suffix for name in names}
    assert {".yaml", ".lock", ".pt", ".json"} <= suffixes and Path("links/origin.json") in names, sorted(map(str, names))
    assert any(kind == "folder" for kind in names.values()), names
    return names


def test_the_recording_finds_the_names_a_run_writes(planted_names):
    assert any(name.parts[:1] == ("eval-cache",) for name in planted_names), planted_names
    assert all(".tmp" not in name.name for name in planted_names), planted_names  # random names are not plantable


def test_no_write_goes_through_a_link_planted_at_any_name_the_product_writes(planted_names, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("precious\n")
    followed = []
    for index, (name, kind) in enumerate(sorted(planted_names.items())):
        root = tmp_path / f"case{index}"
        at = root / "out" / name
        at.parent.mkdir(parents=True, exist_ok=True)
        dangling = outside / f"created-through-{index}"
        at.symlink_to(outside if kind == "folder" else dangling)
        try:
            experiment_writes(root)
        except Exception as err:  # noqa: BLE001 - a refusal is fine; a write outside is not
            assert type(err).__module__.startswith("dapo_ablate"), f"{name}: {type(err).__name__}: {err}"
        if dangling.exists() or sorted(p.name for p in outside.iterdir()) != ["victim"]:
            followed.append(str(name))
        assert (outside / "victim").read_text() == "precious\n", name
        for path in outside.iterdir():
            if path.name != "victim":
                path.unlink()
    assert not followed, f"written through a link planted at: {followed}"
