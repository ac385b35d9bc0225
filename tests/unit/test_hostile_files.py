"""Hostile FILES where a file is expected: a FIFO, /dev/zero, a symlink
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

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_hostile_files_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec, run_root
from dapo_ablate.ablation.store.kept_results import KEPT_RESULT
from dapo_ablate.cli.main import app

from test_fuzz_strategies import hang_guard
from tiny_configs import STAND_IN_TRAINER


HANG_S = 120

"""root reads and writes whatever the modes say: a read-only folder is written, an unreadable file read."""

RESULTS = "a,b,seed,avg@32\n" + "".join(f"{a},{b},{s},{0.4 + 0.1 * a + 0.05 * b + 0.01 * s}\n"
                                        for s in (0, 1) for a in (0, 1) for b in (0, 1))  # fmt: skip

FORGED = {"metrics": {"avg@32": 0.99}, "eval_curve": [], "signals": [], "tokens_generated": 1, "tokens_discarded": 0, "wall_s": 1.0}


def directory(folder: Path) -> Path:
    (folder / "x").mkdir()
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


def test_a_result_planted_in_a_run_folder_is_neither_read_nor_moved_by_status_and_report(tmp_path):
    """Only `run` records a kept result, and only with its seal (tests/e2e/test_integrity_runs.py plants
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
