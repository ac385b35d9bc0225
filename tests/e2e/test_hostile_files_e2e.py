"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_hostile_files.py
describes; its docstring says what they check."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from test_hostile_files import (  # noqa: F401, F811 - shared with the fast part
    HANG_S,
    RESULTS,
    dapo_ablate_here,
    directory,
    snapshot,
    spec_data,
    write_spec,
)

ROOT_USER = os.geteuid() == 0


@dataclass(frozen=True)
class Case:
    """A hostile file (``make`` puts it at ``folder/'x'`` or returns its path) and the command that gets it."""

    make: Callable[[Path], Path]
    command: Callable[[Path], list[str]]
    exit_code: int
    says: str = ""
    """Words of the one-sentence error (exit 2), or of the output (exit 0)."""
    out: str = "out"
    """The case's output folder (relative to its folder): the only place it may write."""
    isolated: bool = False
    """Run in a fresh interpreter with a memory cap (a FIFO or a device: a read could block or never
    end); the others run in this process, under the same hang guard."""


def fifo(folder: Path) -> Path:
    os.mkfifo(folder / "x")
    return folder / "x"


def loop(folder: Path) -> Path:
    (folder / "x").symlink_to(folder / "y")
    (folder / "y").symlink_to(folder / "x")
    return folder / "x"


def link_outside(name: str, text: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        (folder / "outside" / name).write_text(text)
        (folder / "x").symlink_to(folder / "outside" / name)
        return folder / "x"

    return make


def with_mode(text: str, mode: int) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        (folder / "x").write_text(text)
        (folder / "x").chmod(mode)
        return folder / "x"

    return make


def foreign_database(folder: Path) -> Path:
    with sqlite3.connect(folder / "x") as connection:  # another application's tables
        connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO users (name) VALUES ('alice')")
    return folder / "x"


def validate(path: Path) -> list[str]:
    return ["validate", str(path)]


def report_results(path: Path) -> list[str]:
    return ["report", "--results", str(path), "--out", str(path.parent / "out"), "--format", "csv,md"]


def report_into(path: Path) -> list[str]:
    (path.parent / "results.csv").write_text(RESULTS)
    return ["report", "--results", str(path.parent / "results.csv"), "--out", str(path), "--format", "csv"]


def validate_with(field: str, value: Callable[[Path], str]) -> Callable[[Path], list[str]]:
    def command(path: Path) -> list[str]:
        return ["validate", str(write_spec(path.parent)), f"{field}={value(path)}"]

    return command


LEDGER = validate_with("ledger", lambda path: f"sqlite:///{path}")

DATA = validate_with("trainer.data.train", str)

UNREADABLE = "" if ROOT_USER else "cannot be read"

CASES = {
    # the spec
    "spec: a FIFO": Case(fifo, validate, 2, "is not a regular file", isolated=True),
    "spec: /dev/zero": Case(lambda folder: Path("/dev/zero"), validate, 2, "'/dev/zero' is not a regular file", isolated=True),
    "spec: a symlink loop": Case(loop, validate, 2, "is a link loop"),
    "spec: a directory": Case(directory, validate, 2, "is a folder without spec.yaml"),
    "spec: a symlink to a spec outside": Case(link_outside("spec.yaml", yaml.safe_dump(spec_data())), validate, 0, "4 new: 4 of 4 runs still to do"),
    "spec: a read-only file": Case(with_mode(yaml.safe_dump(spec_data()), 0o444), validate, 0, "4 new: 4 of 4 runs still to do"),
    "spec: an unreadable file": Case(with_mode(yaml.safe_dump(spec_data()), 0o000), validate, 0 if ROOT_USER else 2, UNREADABLE),
    # --results
    "results: a FIFO": Case(fifo, report_results, 2, "is not a regular file", isolated=True),
    "results: /dev/zero": Case(lambda folder: Path("/dev/zero"), report_results, 2, "is not a regular file", isolated=True),
    "results: a symlink loop": Case(loop, report_results, 2, "is a link loop; check the --results path"),
    "results: a directory": Case(directory, report_results, 2, "is a directory; pass the results CSV file itself"),
    "results: a symlink to a CSV outside": Case(link_outside("results.csv", RESULTS), report_results, 0, "Claims"),
    "results: a read-only file": Case(with_mode(RESULTS, 0o444), report_results, 0, "Claims"),
    # a data file of the trainer
    "data: a FIFO": Case(fifo, DATA, 2, "is not a regular file (a pipe, socket or device)", isolated=True),
    "data: /dev/zero": Case(lambda folder: Path("/dev/zero"), DATA, 2, "'/dev/zero' is not a regular file", isolated=True),
    "data: a symlink loop": Case(loop, DATA, 2, "is a link loop"),
    "data: a directory": Case(directory, DATA, 2, "is a directory"),
    "data: a symlink to a file outside": Case(link_outside("train.jsonl", '{"prompt": "1+1=", "answer": "2"}\n'), DATA, 0, "4 new: 4 of 4 runs still to do"),
    # the ledger
    "ledger: a FIFO": Case(fifo, LEDGER, 2, "which is not a regular file", isolated=True),
    "ledger: /dev/zero": Case(lambda folder: Path("/dev/zero"), LEDGER, 2, "'/dev/zero', which is not a regular file", isolated=True),
    "ledger: a symlink loop": Case(loop, LEDGER, 2, "which is a link loop; fix `ledger`"),
    "ledger: a directory": Case(directory, LEDGER, 2, "which is a directory"),
    "ledger: another application's SQLite database": Case(foreign_database, LEDGER, 2, "is not a dapo-ablate ledger (it holds other tables: users)"),
    # --out
    "out: /dev/zero": Case(lambda folder: Path("/dev/zero"), report_into, 2, "is a file, not a folder", isolated=True),
    "out: a file": Case(with_mode("keep me", 0o644), report_into, 2, "is a file, not a folder"),
    "out: a symlink loop": Case(loop, report_into, 2, "is a symbolic link that leads nowhere"),  # refused before any work
    "out: a read-only folder": Case(lambda folder: (directory(folder).chmod(0o555), folder / "x")[1], report_into,
                                    0 if ROOT_USER else 2, "" if ROOT_USER else "not writable", out="x"),
}  # fmt: skip


def dapo_ablate(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The command line in a fresh interpreter of at most 3 GiB; killed after HANG_S (a hang guard,
    not a speed limit)."""
    program = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30)); "
               "from dapo_ablate.cli.main import main; main()")  # fmt: skip
    return subprocess.run([sys.executable, "-c", program, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=HANG_S, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_file_gets_one_sentence_or_is_used_safely(tmp_path, name):
    case = CASES[name]
    (tmp_path / "outside").mkdir()
    path = case.make(tmp_path)
    args = case.command(path)
    out = tmp_path / case.out
    before = snapshot(tmp_path, out)
    try:
        done = (dapo_ablate if case.isolated else dapo_ablate_here)(args, tmp_path)
    finally:
        if path.parent == tmp_path and path.exists() and not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)  # tmp_path's cleanup removes what it can read
    assert done.returncode == case.exit_code, (done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    if case.exit_code == 2:
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and case.says in lines[0], done.stderr
    else:
        assert case.says in done.stdout, done.stdout[-2000:]
    assert snapshot(tmp_path, out) == before, "something outside the output folder changed"


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MB file system (tmpfs) at ``tmp_path/disk``, grown by `grow(size)`; needs root to mount."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small file system cannot be mounted here ({mounted.stderr.strip() or 'not root'})")

    def grow(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)

    try:
        yield folder, grow
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_run_whose_disk_fills_says_so_in_one_sentence_and_the_rerun_finishes_it(small_disk):
    """`run` into a folder whose disk fills up (the stores' own writes fill it): one sentence naming
    the store and the fix, no traceback (MLflow logged one per retry, 14 in all); once there is
    room, the rerun finishes every run, training again none that was recorded."""
    from dapo_ablate.ablation.experiment.spec import load_spec

    import support

    folder, grow = small_disk
    spec_path = support.write_spec(folder, "full", factors=["overlong_filter", "clip_higher", "soft_overlong"], seeds=2)
    full = support.dapo_ablate("run", str(spec_path), "--no-progress", cwd=folder)
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-3000:]
    (sentence,) = full.stderr.strip().splitlines()
    assert sentence.startswith("error: ") and "free space on its disk, then rerun" in sentence  # the store's own words vary

    spec = load_spec(spec_path)
    recorded = {run_id for run_id, row in support.rows(spec).items() if row["status"] == "done"}
    grow("64m")
    again = support.dapo_ablate("run", str(spec_path), "--no-progress", cwd=folder)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {row["status"] for row in support.rows(spec).values()} == {"done"}
    # what was recorded before the disk filled is not trained again (a run whose result could not be
    # written anywhere, ledger or kept file, on the full disk is trained again)
    assert {run_id: n for run_id, n in support.calls(spec).items() if run_id in recorded} == dict.fromkeys(recorded, 1)
