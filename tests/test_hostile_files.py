"""Hostile FILES where a file is expected (issue 23's test-suite item): a FIFO, /dev/zero, a symlink
loop, a symlink to outside, a read-only or unreadable file or folder, a directory, another
application's SQLite database named as the ledger, and a result planted in a run folder, each
passed as the spec, the --results CSV, a data file, the ledger or --out.

Each case runs the real command line in a fresh folder: a FIFO or a device in a fresh interpreter
(`python -c 'main()'`, memory capped: a FIFO opened for reading blocks forever, /dev/zero never
ends), the others through typer's CliRunner. The expected outcome is what the product does today:
exit 2 with one sentence naming the file, or (a link to a readable file outside, a read-only input)
the command doing its work. HANG_S guards against a hang only (a subprocess timeout, or SIGALRM in
this process), not a speed limit.
Nothing outside the case's output folder changes: the folder's other files, and a folder `outside`
that links point into.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from test_fuzz_strategies import hang_guard
from tiny_configs import STAND_IN_TRAINER
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec, run_root
from dapo_ablate.ablation.store.kept_results import KEPT_RESULT
from dapo_ablate.cli.main import app

HANG_S = 120
ROOT_USER = os.geteuid() == 0
"""root reads and writes whatever the modes say: a read-only folder is written, an unreadable file read."""
RESULTS = "a,b,seed,avg@32\n" + "".join(f"{a},{b},{s},{0.4 + 0.1 * a + 0.05 * b + 0.01 * s}\n"
                                        for s in (0, 1) for a in (0, 1) for b in (0, 1))  # fmt: skip
FORGED = {"metrics": {"avg@32": 0.99}, "eval_curve": [], "signals": [], "tokens_generated": 1, "tokens_discarded": 0, "wall_s": 1.0}


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


def directory(folder: Path) -> Path:
    (folder / "x").mkdir()
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


def spec_data(**fields) -> dict:
    return {"name": "hostile", "trainer": STAND_IN_TRAINER, "factors": ["overlong_filter", "clip_higher"], "seeds": 1,
            "output_dir": "out", "ledger": "sqlite:///out/ledger.db", "tracking": {"uri": "sqlite:///out/mlflow.db"},
            **fields}  # fmt: skip


def write_spec(folder: Path, **fields) -> Path:
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_data(**fields)))
    return path


def forged_result(folder: Path) -> Path:
    """A result planted where a driver keeps a finished run's result until the ledger holds it."""
    out = folder / "out"  # absolute: run_root resolves a relative output_dir against the working directory
    spec = load_spec(write_spec(folder, output_dir=str(out), ledger=f"sqlite:///{out}/ledger.db",
                                tracking={"uri": f"sqlite:///{out}/mlflow.db"}))
    planted = run_root(spec) / expand(spec).runs[0].run_id / KEPT_RESULT
    planted.parent.mkdir(parents=True)
    planted.write_text(json.dumps(FORGED))
    return planted


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


def snapshot(folder: Path, out: Path) -> dict[str, bytes | str]:
    """Every entry below ``folder`` but ``out`` (and what is below it): a file's bytes, a link's
    target, a special file's kind."""
    found: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        if path == out or out in path.parents:
            continue
        if path.is_symlink():
            found[str(path)] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[str(path)] = path.read_bytes() if os.access(path, os.R_OK) else "unreadable file"
        else:
            found[str(path)] = "directory" if path.is_dir() else "special"
    return found


def dapo_ablate(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The command line in a fresh interpreter of at most 3 GiB; killed after HANG_S (a hang guard,
    not a speed limit)."""
    program = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30)); "
               "from dapo_ablate.cli.main import main; main()")  # fmt: skip
    return subprocess.run([sys.executable, "-c", program, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=HANG_S, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def dapo_ablate_here(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The command line through typer's CliRunner in this process, in ``cwd``, under the hang guard;
    an exception other than the command's exit fails the test with its traceback."""
    before = os.getcwd()
    os.chdir(cwd)
    try:
        with hang_guard(HANG_S):
            result = CliRunner().invoke(app, args)
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


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


def test_a_result_planted_in_a_run_folder_is_neither_read_nor_moved_by_status_and_report(tmp_path):
    """Only `run` records a kept result, and only with its seal (tests/test_integrity_runs.py plants
    forged ones before a real run: each is set aside and its run trains); `status` and `report`
    read the ledger alone: the planted result counts for nothing and stays as it was."""
    planted = forged_result(tmp_path)
    before = snapshot(tmp_path, tmp_path / "report")
    status = dapo_ablate_here(["status", str(tmp_path / "spec.yaml")], tmp_path)
    assert status.returncode == 0 and "done 0" in status.stdout, status.stdout + status.stderr
    report = dapo_ablate_here(["report", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "report")], tmp_path)
    assert report.returncode == 2 and report.stderr.strip().count("\n") == 0, report.stderr
    assert "has no ledger" in report.stderr
    assert snapshot(tmp_path, tmp_path / "report") == before and json.loads(planted.read_text()) == FORGED
    assert not (tmp_path / "report").exists()


def test_a_link_planted_in_out_is_replaced_and_its_target_left_alone(tmp_path):
    """report writes each file by renaming it into --out: a link planted at a report file's name is
    replaced by the report file; the file outside it pointed to is not written through."""
    (tmp_path / "outside").mkdir()
    victim = tmp_path / "outside" / "victim.csv"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "effects.csv").symlink_to(victim)
    (tmp_path / "results.csv").write_text(RESULTS)
    done = dapo_ablate_here(["report", "--results", str(tmp_path / "results.csv"), "--out", str(out), "--format", "csv"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    assert not (out / "effects.csv").is_symlink() and "term" in (out / "effects.csv").read_text()
