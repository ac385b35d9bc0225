"""What the tests share: the repository's folders, the PYTHONPATH that lets a driver and its Ray
workers import the tests' stand-in cell functions, free ports for the Ray clusters the tests start,
and the one way to write an experiment spec for a test (`write_spec`).

The tests live in two trees: ``tests/unit`` (the fast tier: pure logic, in-process, about a minute
in all) and ``tests/e2e`` (real Ray, `dapo-ablate` processes, training; marked ``e2e`` and ``slow``
by ``tests/conftest.py`` from the folder). This module, ``tiny_configs`` and ``verl_cpu`` sit at
``tests/`` and are importable from both (pyproject's ``pythonpath``)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"
TEST_TREES = (TESTS, TESTS / "unit", TESTS / "e2e")
"""The folders a test module may be imported from (pyproject's ``pythonpath``)."""
HANG_GUARD_S = 900
"""The one bound on a test's wait for an event (a process's exit, a job's state, a file): a guard
against a hang on a broken machine, never a time budget a loaded machine could miss."""


def pythonpath_with_tests(*first: str) -> str:
    """PYTHONPATH for a `dapo-ablate` process a test starts: `first`, the test trees (so that
    ``DAPO_ABLATE_CELL_FN=test_module:cell`` imports in the driver and its Ray workers), then the
    caller's own."""
    return os.pathsep.join([*first, *map(str, TEST_TREES), os.environ.get("PYTHONPATH", "")])


def restore_environment(saved: dict[str, str | None]) -> None:
    """Put each variable of `saved` back in os.environ as it was (None: not set)."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- experiment specs -------------------------------------------------------------------------------
STAND_IN_CELL_TRAINER = {"rollout": {"max_response_len": 64}, "algorithm": {"overlong_cache": 8}}
"""The trainer config of specs whose runs a stand-in cell function plays (it is validated, never trained)."""
FACTORS = ["overlong_filter", "clip_higher"]


def spec_data(folder: Path, name: str = "exp", **fields: Any) -> dict[str, Any]:
    """An experiment spec whose stores and run folders live under ``folder/out``: `name`, the
    stand-in trainer, factors OF and CH, one seed, SQLite ledger and MLflow; `fields` replace any of it."""
    out = folder / "out"
    return {"name": name, "trainer": STAND_IN_CELL_TRAINER, "factors": FACTORS, "seeds": 1, "output_dir": str(out),
            "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"}, **fields}


def write_spec(folder: Path, name: str = "exp", **fields: Any) -> Path:
    """`spec_data` written to ``folder/spec.yaml``; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_data(folder, name, **fields)))
    return path


def run(spec_path: Path, cell_fn: Callable[..., dict] | None = None, **options: Any) -> tuple[Any, Any]:
    """(spec, summary) of `run_experiment` on the spec file, in this process (its local Ray), no progress bar."""
    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import load_spec
    from dapo_ablate.ablation.runtime.executor import RunOptions, run_experiment

    spec = load_spec(spec_path)
    return spec, run_experiment(spec, expand(spec), cell_fn=cell_fn, options=RunOptions(progress=False, **options))


def record_finished(spec: Any, parent_run_id: str | None = None) -> None:
    """Every run of `spec`'s plan recorded done in its ledger (avg@32 0.30 + 0.01 per seed), as a
    `run` would leave them, without Ray; `parent_run_id`: the MLflow parent the ledger names."""
    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.store.binding import experiment_digest
    from dapo_ablate.ablation.store.ledger import SQLLedger

    Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict(), digest=experiment_digest(spec))
        ledger.add_runs(spec.name, expand(spec).run_specs())
        for run in expand(spec).runs:
            assert ledger.claim(run.run_id, "h")
            ledger.finish(run.run_id, {"metrics": {"avg@32": 0.3 + 0.01 * run.seed}, "tokens_generated": 1,
                                       "tokens_discarded": 0, "wall_s": 1.0})
        if parent_run_id is not None:
            ledger.set_mlflow_parent(spec.name, parent_run_id)


# -- stand-in cell functions (they run in Ray workers: conftest's local_ray sends this module by value) --
def count_call(run_dir: str) -> None:
    """Record one start of a run in ``run_dir/calls`` (`calls` counts them)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / "calls", "a") as handle:
        handle.write(f"{time.time()}\n")


def counting_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """A trivial run: avg@32 0.25, +0.5 with clip_higher, +0.01 per seed; records each call."""
    count_call(run_dir)
    accuracy = 0.25 + 0.5 * config["techniques"]["clip_higher"] + 0.01 * config["schedule"]["seed"]
    return {
        "metrics": {"avg@32": accuracy, "pass@32": 0.9, "maj@32": accuracy},
        "eval_curve": [{"step": 0, "avg@32": 0.25}, {"step": 2, "avg@32": accuracy}],
        "signals": [{"step": 1, "reward": 0.0}, {"step": 2, "reward": 0.5}],
        "tokens_generated": 100, "tokens_discarded": 10, "wall_s": 0.1,
    }


PLANTED = {"dynamic_sampling": 0.08, "clip_higher": 0.03}
"""The effects `planted_cell` plants (fractions of avg@32); every other technique does nothing."""


def planted_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """A run whose avg@32 is 0.40 plus `PLANTED`'s effects of the techniques that are on, plus a
    deterministic noise of at most +-1.5 pp drawn from (techniques, seed, setting's config)."""
    count_call(run_dir)
    techniques = config["techniques"]
    blob = json.dumps([sorted(techniques.items()), config["schedule"]["seed"], config["rollout"]], sort_keys=True)
    noise = (int(hashlib.sha256(blob.encode()).hexdigest()[:8], 16) / 16**8 - 0.5) * 0.03
    accuracy = 0.40 + sum(effect for name, effect in PLANTED.items() if techniques.get(name)) + noise
    return {"metrics": {"avg@32": accuracy}, "eval_curve": [{"step": 0, "avg@32": 0.40}, {"step": 2, "avg@32": accuracy}],
            "signals": [{"step": 1, "reward": 0.0}], "tokens_generated": 100, "tokens_discarded": 0, "wall_s": 0.1}


# -- what a run left ----------------------------------------------------------------------------------
def calls(spec: Any) -> dict[str, int]:
    """Run id -> how many times a cell function started it."""
    from dapo_ablate.ablation.experiment.design import expand

    root = Path(spec.output_dir) / spec.name
    return {run.run_id: _lines(root / run.run_id / "calls") for run in expand(spec).runs}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def rows(spec: Any) -> dict[str, dict[str, Any]]:
    """Run id -> its ledger row."""
    from dapo_ablate.ablation.store.ledger import SQLLedger

    with SQLLedger(spec.ledger) as ledger:
        return {row["run_id"]: row for row in ledger.runs_table(spec.name)}


def mlflow_children(spec: Any) -> dict[str, list[Any]]:
    """Ledger run id -> the active MLflow child runs carrying it."""
    from mlflow import MlflowClient

    from dapo_ablate.ablation.store.tracking import RUN_ID_TAG

    client = MlflowClient(spec.tracking.uri)
    experiment = client.get_experiment_by_name(spec.name)
    children: dict[str, list[Any]] = {}
    for run in client.search_runs([experiment.experiment_id], f"tags.`{RUN_ID_TAG}` != ''"):
        children.setdefault(run.data.tags[RUN_ID_TAG], []).append(run)
    return children


# -- the real command --------------------------------------------------------------------------------
COMMAND = str(Path(sys.executable).parent / "dapo-ablate")


def dapo_ablate(*argv: str, cwd: Path, cell: str = "support:counting_cell") -> subprocess.CompletedProcess:
    """The real `dapo-ablate ARGV` in `cwd` with the stand-in cell function `cell` (module:function,
    no training), in its own session, reaped after; a hang is cut at HANG_GUARD_S."""
    from dapo_ablate.ablation.runtime.reaper import kill_session
    from dapo_ablate.ablation.runtime.task import CELL_FN_ENV

    environment = {**os.environ, CELL_FN_ENV: cell, "PYTHONPATH": pythonpath_with_tests()}
    process = subprocess.Popen([COMMAND, *argv], cwd=cwd, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=HANG_GUARD_S)
    finally:
        kill_session(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)
