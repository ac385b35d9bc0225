"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_executor.py
describes; its docstring says what they check."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.hosts import this_host
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.ablation.store.results import load_experiment_results, status_rows

from support import (
    FACTORS,
    calls,
    count_call,
    counting_cell,
    mlflow_children,
    rows,
    run,
    write_spec,
)
from tiny_configs import TINY_TRAINER


def failing_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """Like counting_cell, but the CH-only cell raises."""
    techniques = config["techniques"]
    if techniques["clip_higher"] and not techniques["overlong_filter"]:
        count_call(run_dir)
        raise ValueError("no luck in this cell")
    return counting_cell(config, run_dir, eval_cache_dir)


def timed_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """Sleeps a little and records (start, end) so a test can check overlap."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    start = time.time()
    time.sleep(0.3)
    (Path(run_dir) / "span").write_text(f"{start} {time.time()}")
    return counting_cell(config, run_dir, eval_cache_dir)


# -- the real trainer --------------------------------------------------------------------------
TINY_TRAINER = {**TINY_TRAINER, "schedule": {"total_steps": 2}}  # evaluations at steps 0 and 2


# -- tests -------------------------------------------------------------------------------------
def test_every_run_is_trained_once_and_logged_once(local_ray, tmp_path: Path):
    spec, summary = run(write_spec(tmp_path), counting_cell)
    assert summary.exit_code == 0 and summary.finished == 4
    assert summary.counts == {"pending": 0, "running": 0, "done": 4, "failed": 0}
    children = mlflow_children(spec)
    plan = expand(spec)
    assert {run.run_id for run in plan.runs} == set(children)
    by_name = {runs[0].info.run_name: runs[0] for runs in children.values()}
    assert set(by_name) == {"baseline s0", "OF s0", "CH s0", "OF+CH s0"}
    ch = by_name["CH s0"]
    assert ch.data.metrics["val-core/builtin/acc/mean_at_32"] == 0.75 and ch.data.params["factor.clip_higher"] == "1"
    assert ch.data.tags["dapo.design"] == "full" and ch.data.tags["dapo.cell"] == "01"
    ledger_rows = rows(spec)
    assert all(row["mlflow_run_id"] == children[run_id][0].info.run_id for run_id, row in ledger_rows.items())

    # Running it again trains nothing and logs nothing new.
    _, again = run(write_spec(tmp_path), counting_cell)
    assert again.exit_code == 0 and again.finished == 0 and again.already_done == 4
    assert set(calls(spec).values()) == {1}
    assert all(len(runs) == 1 for runs in mlflow_children(spec).values())


def test_a_failing_run_is_recorded_and_only_it_is_retried_on_rerun(local_ray, tmp_path: Path):
    spec, summary = run(write_spec(tmp_path), failing_cell)
    assert summary.exit_code == 1
    assert summary.counts == {"pending": 0, "running": 0, "done": 3, "failed": 1}
    failed = next(row for row in rows(spec).values() if row["status"] == "failed")
    assert failed["error"].startswith("ValueError: no luck in this cell (at test_executor_e2e.py:")
    assert failed["attempts"] == 2  # retries: 1 within the invocation
    assert summary.failures == {"CH s0": failed["error"]}
    (failed_child,) = mlflow_children(spec)[failed["run_id"]]  # one child for both attempts, shown FAILED
    assert failed_child.info.status == "FAILED"

    # attempts count across invocations: a plain rerun does not try the failed run again ...
    _, rerun = run(write_spec(tmp_path), counting_cell)
    assert rerun.exit_code == 1 and rerun.finished == 0
    assert calls(spec)[failed["run_id"]] == 2 and rows(spec)[failed["run_id"]]["attempts"] == 2
    # ... `run --retry-failed` does, on purpose
    _, rerun = run(write_spec(tmp_path), counting_cell, retry_failed=True)
    assert rerun.exit_code == 0 and rerun.finished == 1
    after = calls(spec)
    assert after.pop(failed["run_id"]) == 3 and set(after.values()) == {1}
    assert rows(spec)[failed["run_id"]]["error"] is None
    (child,) = mlflow_children(spec)[failed["run_id"]]  # the failed child continued, now FINISHED
    assert child.info.run_id == failed_child.info.run_id and child.info.status == "FINISHED"


def test_adding_seeds_runs_only_the_new_runs(local_ray, tmp_path: Path):
    spec, _ = run(write_spec(tmp_path, seeds=1), counting_cell)
    first = {run_id: row["mlflow_run_id"] for run_id, row in rows(spec).items()}
    spec2, summary = run(write_spec(tmp_path, seeds=2), counting_cell)
    assert summary.already_done == 4 and summary.finished == 4 and summary.exit_code == 0
    assert set(calls(spec2).values()) == {1}
    assert all(rows(spec2)[run_id]["mlflow_run_id"] == mlflow_id for run_id, mlflow_id in first.items())
    assert len(mlflow_children(spec2)) == 8


def test_runs_held_by_a_dead_driver_on_this_host_are_taken_over_at_once(local_ray, tmp_path: Path):
    spec_path = write_spec(tmp_path, executor={"lease_s": 3600})
    spec = load_spec(spec_path)
    plan = expand(spec)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    held_dead, held_live = plan.runs[0].run_id, plan.runs[1].run_id
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict())
        ledger.add_runs(spec.name, plan.run_specs())
        namespace = this_host().rpartition(":")[0]  # hostname and pid namespace of this driver
        assert ledger.claim(held_dead, f"{namespace}:{dead.pid}", lease_s=3600)
        assert ledger.claim(held_live, "another-node:4711", lease_s=3600)  # alive, elsewhere
        # a container with the same hostname but its own pid namespace: its pids mean nothing here
        assert ledger.claim(plan.runs[2].run_id, f"{socket.gethostname()}/pidns-1:{dead.pid}", lease_s=3600)
    _, summary = run(spec_path, counting_cell)
    after = rows(spec)
    assert after[held_dead]["status"] == "done" and after[held_dead]["attempts"] == 1
    assert after[held_live]["status"] == "running" and after[held_live]["host"] == "another-node:4711"
    assert after[plan.runs[2].run_id]["status"] == "running"
    assert summary.counts["done"] == 2 and summary.exit_code == 0  # the rest is held by live drivers, which finish it


def test_max_concurrent_bounds_the_runs_in_flight(local_ray, tmp_path: Path):
    spec, summary = run(write_spec(tmp_path), timed_cell, max_concurrent=1)
    assert summary.exit_code == 0
    spans = sorted(
        tuple(map(float, (Path(spec.output_dir) / spec.name / run.run_id / "span").read_text().split()))
        for run in expand(spec).runs
    )
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))


def test_results_table_curves_and_status(local_ray, tmp_path: Path):
    spec_path = write_spec(tmp_path, seeds=2)
    spec = load_spec(spec_path)
    before, counts = status_rows(spec, expand(spec))
    assert counts["new"] == 8 and not Path(spec.output_dir).exists()  # reading creates nothing
    run(spec_path, counting_cell)
    results, factors, curves, design, logger = load_experiment_results(spec_path)
    assert factors == FACTORS and design == "full" and logger is not None
    assert list(results.columns[:5]) == [*FACTORS, "seed", "avg@32", "pass@32"]
    assert {"maj@32", "tokens_generated", "tokens_discarded", "wall_s", "run_id"} <= set(results.columns)
    assert len(results) == 8
    assert results.groupby("clip_higher")["avg@32"].mean().round(3).to_dict() == {0: 0.255, 1: 0.755}
    assert len(curves) == 16 and list(curves.columns[:4]) == [*FACTORS, "seed", "step"]
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.md").write_text("# report")
    logger.log_artifacts(str(report), "report")
    statuses, counts = status_rows(spec, expand(spec))
    assert counts["done"] == 8 and statuses[0]["metric"] == 0.25 and statuses[0]["label"] == "baseline"


@pytest.mark.slow
def test_real_trainer_end_to_end_through_ray_ledger_and_mlflow(local_ray, tmp_path: Path):
    spec_path = write_spec(tmp_path, trainer=TINY_TRAINER)
    spec, summary = run(spec_path)  # the default cell function: core.trainer.train
    assert summary.exit_code == 0, summary.failures
    results, _, curves, _, _ = load_experiment_results(spec_path)
    assert len(results) == 4 and results["avg@4"].between(0, 1).all()
    assert (results["tokens_generated"] > 0).all() and (results["wall_s"] > 0).all()
    assert sorted(curves["step"].unique()) == [0, 2]
    # Every cell shares the base policy and evaluation settings: one step-0 evaluation.
    assert curves[curves["step"] == 0]["avg@4"].nunique() == 1
    assert len(list((Path(spec.output_dir) / "eval-cache").glob("*.json"))) == 1
    for run_id, children in mlflow_children(spec).items():
        (child,) = children
        assert child.info.status == "FINISHED" and "val-core/builtin/acc/mean_at_4" in child.data.metrics
        assert "actor/entropy" in child.data.metrics and child.data.params["rollout.eval_k"] == "4"
    assert all((Path(spec.output_dir) / spec.name / run.run_id / "result.json").is_file() for run in expand(spec).runs)
    # the report of the experiment, read from the ledger, with every file the reports promise
    from typer.testing import CliRunner

    from dapo_ablate.cli.main import app

    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", str(spec_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    tables = ["cells", "cumulative", "orderings", "shapley", "effects", "leave_one_out", "compute"]
    expected = {f"{t}.{ext}" for t in tables for ext in ("csv", "md", "tex")}
    expected |= {"report.md", "report.html", "shapley.png", "learning_curves.png"}
    assert expected <= {p.name for p in out.iterdir()}


@pytest.mark.postgres
def test_a_cluster_setup_with_postgresql_ledger_and_mlflow(local_ray, tmp_path: Path, postgres_url: str,
                                                           postgres_mlflow_url: str):
    spec_path = write_spec(tmp_path, ledger=postgres_url, tracking={"uri": postgres_mlflow_url})
    spec, summary = run(spec_path, failing_cell)
    assert summary.counts == {"pending": 0, "running": 0, "done": 3, "failed": 1}
    spec, summary = run(spec_path, counting_cell, retry_failed=True)
    assert summary.exit_code == 0 and summary.finished == 1
    assert all(len(runs) == 1 for runs in mlflow_children(spec).values()) and len(mlflow_children(spec)) == 4
    assert (tmp_path / "out" / "mlartifacts").is_dir()  # not ./mlruns wherever the driver started
