"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_sweep.py
describes; its docstring says what they check."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.ablation.store.tracking import PARENT_TAG, ROLE_TAG, RUN_ID_TAG
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.knobs import format_params
from dapo_ablate.sweeps.report import read_report, write_report
from dapo_ablate.sweeps.report_data import shown_best, shown_trials
from dapo_ablate.sweeps.runner import run_sweep
from dapo_ablate.sweeps.spec import load_sweep
from dapo_ablate.sweeps.trials import plan_trial

from support import HANG_GUARD_S, pythonpath_with_tests
from test_sweep import TRAINER, _dead_pid, _KilledWhileSampling, trials, write_sweep  # noqa: F401, F811 - shared with the fast part
from tiny_configs import TINY_TRAINER


@pytest.fixture(scope="module")
def shared_mlflow(tmp_path_factory) -> str:
    """One MLflow store for the module (a fresh store spends seconds on its migrations); each
    test's sweep has its own name, so its own MLflow experiment."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def sweep(path: Path, cell_fn, **kwargs: Any):
    spec = load_sweep(path)
    return spec, run_sweep(spec, cell_fn=cell_fn, progress=False, **kwargs)


# -- cell functions (they run in Ray workers) --------------------------------------------------
def accuracy(config: dict) -> float:
    """Peaks at eps_high = 0.3 with clip_higher on; off, eps_low (0.2) is used. Seed 1 adds
    0.01 with clip_higher on only, so effects differ between seeds."""
    algorithm, on = config["algorithm"], config["techniques"]["clip_higher"]
    eps = algorithm["eps_high"] if on else algorithm["eps_low"]
    return 0.9 - 4 * (eps - 0.3) ** 2 + 0.01 * config["schedule"]["seed"] * on


def _calls(run_dir: str, what: str) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / what, "a") as handle:
        handle.write(f"{time.time()}\n")


def _curve_cell(config: dict, run_dir: str, on_eval, seconds_per_step: float) -> dict:
    """Evaluates every eval_every steps (value rising to `accuracy` linearly), streaming them."""
    _calls(run_dir, "calls")
    k, schedule = config["rollout"]["eval_k"], config["schedule"]
    final, total = accuracy(config), schedule["total_steps"]
    curve = []
    for step in range(total + 1):
        if step % schedule["eval_every"] == 0 or step == total:
            row = {"step": step, f"avg@{k}": final * step / total}
            curve.append(row)
            if on_eval is not None:
                on_eval(step, row)
        if step < total:
            time.sleep(seconds_per_step)
    _calls(run_dir, "done")
    return {"metrics": {f"avg@{k}": final}, "eval_curve": curve, "signals": [{"step": 1, "reward": 0.5}],
            "tokens_generated": 100, "tokens_discarded": 0, "wall_s": seconds_per_step * total}


def quick_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    return _curve_cell(config, run_dir, on_eval, 0.02)


def slow_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    return _curve_cell(config, run_dir, on_eval, 0.15)


HOLD_ENV = "DAPO_TEST_SWEEP_HOLD"


def held_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    """quick_cell, except that while the file named by $DAPO_TEST_SWEEP_HOLD exists, a cell started
    once two others are done writes `held` in its folder and waits until that file is removed: a
    driver killed then has two trials done and one running, however busy the machine is."""
    hold = os.environ.get(HOLD_ENV)
    if hold and len(list(Path(run_dir).parent.glob("*/done"))) >= 2 and Path(hold).exists():
        _calls(run_dir, "held")
        deadline = time.time() + HANG_GUARD_S
        while Path(hold).exists() and time.time() < deadline:
            time.sleep(0.1)
    return _curve_cell(config, run_dir, on_eval, 0.02)


def plain_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """A cell function without on_eval (the executor's signature): no streaming."""
    return _curve_cell(config, run_dir, None, 0.0)


def picky_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    if config["algorithm"]["eps_high"] > 0.4:
        raise ValueError("eps_high too high for this cell")
    return quick_cell(config, run_dir, eval_cache_dir, on_eval)


def calls(spec, trial: optuna.trial.FrozenTrial, what: str = "calls") -> dict[str, int]:
    root = Path(spec.output_dir) / spec.name
    return {run_id: _lines(root / run_id / what) for run_id in trial.user_attrs["runs"]}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def ledger_rows(spec) -> dict[str, dict[str, Any]]:
    with SQLLedger(spec.ledger) as ledger:
        return {row["run_id"]: row for row in ledger.runs_table(spec.name)}


# -- a killed driver ---------------------------------------------------------------------------
def optuna_schema_ready(url: str) -> bool:
    """Read-only: Optuna's tables exist and its schema version is stamped (the last step of
    RDBStorage's set-up), so opening the storage here creates nothing."""
    import sqlalchemy

    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return False
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            if not sqlalchemy.inspect(conn).has_table("alembic_version"):
                return False
            return conn.execute(sqlalchemy.text("SELECT count(*) FROM alembic_version")).scalar() > 0
    except sqlalchemy.exc.SQLAlchemyError:
        return False
    finally:
        engine.dispose()


# -- study mechanics ---------------------------------------------------------------------------
def test_pruned_trials_stop_their_runs_and_complete_ones_are_told_their_value(local_ray, tmp_path, ledger_url, shared_mlflow):
    # Random draws in order (seed 3): the median pruner, after 2 complete trials, stops a trial
    # whose step-2 value is below the earlier trials' median at step 2.
    path = write_sweep(tmp_path, mlflow=shared_mlflow, ledger=ledger_url, n_trials=6, pruner={"type": "median", "n_startup_trials": 2},
                       executor={"retries": 0, "max_concurrent": 1})
    spec, summary = sweep(path, slow_cell)
    assert summary.exit_code == 0 and summary.counted == 6 and summary.finished_now == 6
    found = trials(spec)
    pruned = [t for t in found if t.state == TrialState.PRUNED]
    complete = [t for t in found if t.state == TrialState.COMPLETE]
    assert pruned and complete and len(pruned) + len(complete) == 6
    rows = ledger_rows(spec)
    for t in complete:
        (run_id,) = t.user_attrs["runs"]
        assert t.value == pytest.approx(0.9 - 4 * (t.params["eps_high"] - 0.3) ** 2)
        assert sorted(t.intermediate_values) == [2, 4, 6]  # step 0 is not reported
        assert rows[run_id]["status"] == "done" and calls(spec, t) == {run_id: 1}
    for t in pruned:
        (run_id,) = t.user_attrs["runs"]
        assert t.user_attrs["pruned_at_step"] == max(t.intermediate_values) < 6  # never at the last step
        assert rows[run_id]["status"] == "pending" and rows[run_id]["attempts"] == 0  # released, not failed
        assert calls(spec, t, "done") == {run_id: 0}  # its task was cancelled before finishing
    best = max(complete, key=lambda t: t.value)
    assert summary.best_number == best.number and summary.best_params == best.params

    # Rerunning a finished study trains nothing and asks no new trial.
    _, again = sweep(path, slow_cell)
    assert again.finished_now == 0 and again.counted == 6 and len(trials(spec)) == 6


def test_no_trial_is_pruned_at_its_last_evaluation(local_ray, tmp_path, shared_mlflow):
    # The only evaluation after step 0 is the last one: a run there has done all its training,
    # so the median pruner, which would stop the worse half, is not asked.
    trainer = {**TRAINER, "schedule": {"total_steps": 2, "eval_every": 2}}
    path = write_sweep(tmp_path, mlflow=shared_mlflow, trainer=trainer, n_trials=5,
                       pruner={"type": "median", "n_startup_trials": 1}, executor={"retries": 0, "max_concurrent": 1})
    spec, summary = sweep(path, quick_cell)
    assert summary.states == {"COMPLETE": 5}
    assert all(list(t.intermediate_values) == [2] for t in trials(spec))


def test_failures_are_recorded_on_the_trial_and_count_towards_n_trials(local_ray, tmp_path, shared_mlflow):
    # Grid over (eps_low, eps_high): (0.2, 0.25) trains; eps_high 0.45 makes the cell raise;
    # (0.3, 0.25) is a setting the trainer refuses (eps_high < eps_low): no run at all.
    path = write_sweep(tmp_path, mlflow=shared_mlflow, sampler="grid", n_trials=None, space={
        "eps_low": {"choices": [0.2, 0.3]}, "eps_high": {"choices": [0.25, 0.45]}})
    spec, summary = sweep(path, picky_cell, n_trials=10)  # --n-trials beyond the grid: capped at its 4 points
    assert summary.exit_code == 0 and summary.counted == summary.n_trials == 4
    by_params = {(t.params["eps_low"], t.params["eps_high"]): t for t in trials(spec)}
    assert by_params[(0.2, 0.25)].state == TrialState.COMPLETE
    for key in ((0.2, 0.45), (0.3, 0.45)):
        t = by_params[key]
        assert t.state == TrialState.FAIL
        assert t.user_attrs["error"].startswith("trial ") and "ValueError: eps_high too high for this cell" in t.user_attrs["error"]
        (run_id,) = t.user_attrs["runs"]
        assert ledger_rows(spec)[run_id]["status"] == "failed"
    refused = by_params[(0.3, 0.25)]
    assert refused.state == TrialState.FAIL and "runs" not in refused.user_attrs
    assert "eps_high (0.25) is below eps_low (0.3)" in refused.user_attrs["error"]
    assert set(summary.failures) == {t.number for t in by_params.values() if t.state == TrialState.FAIL}


def test_a_cell_function_without_on_eval_still_reports_its_curve(local_ray, tmp_path, shared_mlflow):
    spec, summary = sweep(write_sweep(tmp_path, mlflow=shared_mlflow, n_trials=2), plain_cell)
    assert summary.exit_code == 0
    assert all(sorted(t.intermediate_values) == [2, 4, 6] for t in trials(spec))


def test_stale_trials_of_another_host_are_failed_and_retried_through_the_heartbeat(local_ray, tmp_path, ledger_url, shared_mlflow):
    path = write_sweep(tmp_path, mlflow=shared_mlflow, ledger=ledger_url, n_trials=3, heartbeat={"interval_s": 1, "grace_period_s": 2})
    spec = load_sweep(path)
    SQLLedger(spec.ledger).close()  # creates the SQLite folder, as the driver does
    study = studies.open_study(spec, studies.open_storage(spec, driver="another-node:4711"))
    lost = studies.ask(study, spec)  # its driver stops beating
    time.sleep(3)
    _, summary = sweep(path, quick_cell)
    assert summary.exit_code == 0 and summary.counted == 3
    found = {t.number: t for t in trials(spec)}
    assert found[lost.number].state == TrialState.FAIL
    (retry,) = [t for t in found.values() if t.system_attrs.get("failed_trial") == lost.number]
    assert retry.state == TrialState.COMPLETE and retry.params == lost.params
    assert len(found) == 4  # the stale trial, its retry and two new ones


def test_robustness_mode_measures_each_factors_effect_per_knob_setting(local_ray, tmp_path, shared_mlflow):
    path = write_sweep(tmp_path, mlflow=shared_mlflow, n_trials=3, factors=["clip_higher"], seeds_per_trial=2)
    spec, summary = sweep(path, quick_cell)
    assert summary.exit_code == 0
    for t in trials(spec):
        eps = t.params["eps_high"]
        on = [0.9 - 4 * (eps - 0.3) ** 2 + 0.01 * seed for seed in (0, 1)]
        off = 0.9 - 4 * (0.2 - 0.3) ** 2
        assert t.value == pytest.approx(sum(on) / 2)  # the full-on cell's objective
        effect = t.user_attrs["effects"]["clip_higher"]
        assert effect["per_seed"] == pytest.approx([on[0] - off, on[1] - off]) and effect["n"] == 2
        # 95% t interval over two seeds: mean +- t(0.975, 1) * sd / sqrt(2), sd = 0.01 / sqrt(2)
        half = 12.706204736 * (0.01 / math.sqrt(2)) / math.sqrt(2)
        assert (effect["ci_low"], effect["ci_high"]) == pytest.approx((effect["mean"] - half, effect["mean"] + half))
        assert len(t.user_attrs["runs"]) == 4  # 2 cells x 2 seeds

    report = read_report(spec)
    assert list(report.effects["factor"].unique()) == ["clip_higher"] and len(report.effects) == 3
    assert report.effect_summary.loc[0, "settings"] == 3
    paths = {p.name for p in write_report(report, tmp_path / "report")}
    assert {"report.md", "trials.csv", "effects.csv", "effect_summary.csv", "importances.csv", "effects.png",
            "history.png", "importances.png"} <= paths
    assert set(report.importances["target"]) == {"objective", "effect.clip_higher"}
    assert "## Factor effects across knob settings" in (tmp_path / "report" / "report.md").read_text()


def test_too_few_trials_for_importances_is_a_note_not_an_error(local_ray, tmp_path, shared_mlflow):
    spec, _ = sweep(write_sweep(tmp_path, mlflow=shared_mlflow, n_trials=1), quick_cell)
    report = read_report(spec)
    assert report.importances.empty and "at least 3 complete trials (this study has 1)" in report.importance_note
    write_report(report, tmp_path / "r")
    assert "at least 3 complete trials" in (tmp_path / "r" / "report.md").read_text()
    assert (tmp_path / "r" / "best_params.csv").read_text().startswith("trial,avg@4,eps_high")


def test_console_trial_lines_and_best_trial_show_the_knobs_as_the_report_does(local_ray, tmp_path, shared_mlflow, capsys):
    space = {"eps_high": {"low": 0.2, "high": 0.5}, "lr": {"low": 1.0e-4, "high": 1.0e-3, "log": True}}
    spec, summary = sweep(write_sweep(tmp_path, mlflow=shared_mlflow, n_trials=3, space=space), quick_cell)
    started = dict(re.findall(r"^trial (\d+)\s+started\s+(.*?)  \(", capsys.readouterr().out, flags=re.M))
    report = read_report(spec)
    shown = shown_trials(report).frame
    assert sorted(started) == [str(n) for n in shown["trial"]]
    for _, cells in shown.iterrows():
        assert started[cells["trial"]] == f"eps_high={cells['eps_high']} lr={cells['lr']}"
    # lr in [1e-4, 1e-3] reads 3.2e-4 (knobs.knob_text), not 0.000316
    assert all(re.fullmatch(r"eps_high=0\.\d+ lr=\d(\.\d+)?e-[34]", text) for text in started.values()), started
    best = shown_best(report).frame.iloc[0]
    assert format_params(summary.best_params, summary.knob_digits) == f"eps_high={best['eps_high']} lr={best['lr']}"


def test_optuna_dashboard_reads_the_study_from_the_ledger_database(local_ray, tmp_path, shared_mlflow):
    dashboard = pytest.importorskip("optuna_dashboard")  # the `dashboard` extra
    import json
    from wsgiref.util import setup_testing_defaults

    spec, _ = sweep(write_sweep(tmp_path, mlflow=shared_mlflow, n_trials=2), quick_cell)
    app = dashboard.wsgi(studies.storage_url(spec.ledger))

    def get(path: str, query: str = "") -> Any:
        environ: dict[str, Any] = {}
        setup_testing_defaults(environ)
        environ.update(PATH_INFO=path, QUERY_STRING=query)
        status: list[str] = []
        body = b"".join(app(environ, lambda code, headers, exc_info=None: status.append(code)))
        assert status == ["200 OK"]
        return json.loads(body)

    (summary,) = [s for s in get("/api/studies")["study_summaries"] if s["study_name"] == spec.name]
    detail = get(f"/api/studies/{summary['study_id']}", "after=0")
    assert [t["state"] for t in detail["trials"]] == ["Complete", "Complete"]
    assert [v["step"] for v in detail["trials"][0]["intermediate_values"]] == [2, 4, 6]


# -- MLflow ------------------------------------------------------------------------------------
def test_mlflow_study_parent_trial_children_runs_and_best_tag(local_ray, tmp_path, mlflow_uri):
    from mlflow import MlflowClient

    path = write_sweep(tmp_path, mlflow=mlflow_uri, n_trials=4, seeds_per_trial=2)
    spec, summary = sweep(path, quick_cell)
    client = MlflowClient(spec.tracking.uri if not spec.tracking.uri.startswith("postgresql://")
                          else "postgresql+psycopg://" + spec.tracking.uri[len("postgresql://"):])
    experiment = client.get_experiment_by_name(spec.name)
    everything = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in everything if r.data.tags.get(ROLE_TAG) == "parent"]
    children = [r for r in everything if r.data.tags.get(ROLE_TAG) == "trial"]
    assert parent.info.status == "FINISHED" and parent.data.tags["dapo.kind"] == "sweep"
    assert len(children) == 4 and all(c.data.tags[PARENT_TAG] == parent.info.run_id for c in children)
    best = [c for c in children if c.data.tags["best_trial"] == "true"]
    assert [c.data.tags["dapo.trial"] for c in best] == [str(summary.best_number)]
    assert parent.data.tags["best.trial"] == str(summary.best_number)
    assert float(parent.data.tags["best.eps_high"]) == pytest.approx(summary.best_params["eps_high"])
    assert parent.data.metrics["best_avg_at_4"] == pytest.approx(summary.best_value)
    (b,) = best
    assert b.data.metrics["avg_at_4"] == pytest.approx(summary.best_value)
    assert float(b.data.params["eps_high"]) == pytest.approx(summary.best_params["eps_high"])
    history = client.get_metric_history(b.info.run_id, "eval/avg_at_4")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [2, 4, 6]
    runs = [r for r in everything if r.data.tags.get(PARENT_TAG) == b.info.run_id]
    assert len(runs) == 2 and all(RUN_ID_TAG in r.data.tags for r in runs)  # its two seeds

    # Rerunning logs nothing twice.
    sweep(path, quick_cell)
    again = client.search_runs([experiment.experiment_id])
    assert len(again) == len(everything)


def test_resume_after_the_driver_is_killed(tmp_path, ledger_url, shared_mlflow):
    path = write_sweep(tmp_path, mlflow=shared_mlflow, ledger=ledger_url, n_trials=6, heartbeat={"interval_s": 1, "grace_period_s": 600})
    spec = load_sweep(path)
    assert len(plan_trial(spec, 0, {"eps_high": 0.3}).runs) == 1  # a trial is one cell: two cells done, two trials
    hold = tmp_path / "hold"
    hold.touch()
    env = {**os.environ, CELL_FN_ENV: "test_sweep_e2e:held_cell", HOLD_ENV: str(hold),
           "PYTHONPATH": pythonpath_with_tests()}
    command = [sys.executable, "-m", "dapo_ablate.cli.main", "sweep", str(path), "--no-progress"]
    driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + HANG_GUARD_S
    # Events, not timing: a third cell waits in held_cell until `hold` is removed, so the driver
    # cannot finish before it is killed with two trials complete and one running.
    while time.time() < deadline and driver.poll() is None:
        time.sleep(0.3)
        if not list((tmp_path / "out" / spec.name).glob("*/held")) or not optuna_schema_ready(spec.ledger):
            continue
        found = trials(spec)
        done_before = {t.number: t for t in found if t.state == TrialState.COMPLETE}
        if len(done_before) >= 2 and any(t.state == TrialState.RUNNING for t in found):
            break
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    hold.unlink()  # the killed driver's held cells may finish; the rerun's cells do not wait
    found = trials(spec)
    done_before = {t.number: t for t in found if t.state == TrialState.COMPLETE}
    running_before = {t.number: t for t in found if t.state == TrialState.RUNNING}
    assert len(done_before) >= 2 and running_before

    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    assert f"{spec.name}: 6/6 trials finished" in rerun.stdout
    after = {t.number: t for t in trials(spec)}
    assert studies.counted_trials(list(after.values())) == 6
    for number, t in done_before.items():  # completed trials are kept and not trained again
        assert after[number].state == TrialState.COMPLETE and after[number].value == t.value
        assert set(calls(spec, after[number]).values()) == {1}
    for number, t in running_before.items():  # the killed driver's trials were queued again
        assert after[number].state == TrialState.FAIL and "stopped; queued again" in after[number].user_attrs["error"]
        (retry,) = [r for r in after.values() if r.system_attrs.get("failed_trial") == number]
        assert retry.state == TrialState.COMPLETE and retry.params == t.params
    assert {row["status"] for row in ledger_rows(spec).values()} == {"done"}
    # the resumed driver's sampler did not replay the first driver's draws
    drawn = [tuple(sorted(t.params.items())) for t in after.values() if "failed_trial" not in t.system_attrs]
    assert len(drawn) == len(set(drawn)), drawn


@pytest.mark.slow
def test_real_trainer_sweep_end_to_end(local_ray, tmp_path, shared_mlflow):
    path = write_sweep(tmp_path, mlflow=shared_mlflow, trainer=TINY_TRAINER, n_trials=2, space={"eps_high": {"low": 0.2, "high": 0.4}},
                       sampler={"type": "tpe", "seed": 0}, pruner="median")
    spec, summary = sweep(path, None)  # the default cell function: the trainer, streaming evaluations
    assert summary.exit_code == 0, summary.failures
    found = trials(spec)
    assert [t.state for t in found] == [TrialState.COMPLETE] * 2
    for t in found:
        assert sorted(t.intermediate_values) == [2, 4] and 0 <= t.value <= 1
        assert t.value == t.intermediate_values[4]  # the last evaluation is the final metric
        plan = plan_trial(spec, t.number, t.params)
        assert list(t.user_attrs["runs"]) == [run.run_id for run in plan.runs]
        (run,) = plan.runs
        assert (Path(spec.output_dir) / spec.name / run.run_id / "result.json").is_file()
        assert run.config.algorithm.eps_high == t.params["eps_high"]


def test_status_and_ui_read_a_sweeps_spec_and_its_folder(local_ray, tmp_path):
    from typer.testing import CliRunner

    from dapo_ablate.ablation.app.sweep import sweep_ui_server
    from dapo_ablate.ablation.runtime.executor import SWEEP_RECORD
    from dapo_ablate.cli.main import app

    from support import free_port

    path = write_sweep(tmp_path, n_trials=3)
    spec, summary = sweep(path, quick_cell)
    folder = tmp_path / "out" / spec.name
    assert (folder / SWEEP_RECORD).is_file()
    for target in (path, folder):
        shown = CliRunner().invoke(app, ["status", str(target)], terminal_width=200)
        assert shown.exit_code == 0, shown.output
        assert f"{spec.name} (sweep, 3 trials)" in shown.output and "complete 3  (n_trials 3)" in shown.output
        assert f"best so far: trial {summary.best_number}," in shown.output and "sweep-report" in shown.output
    server = sweep_ui_server(spec, free_port(), "dapo-ablate sweep sweep.yaml")
    assert server.note is None and "/experiments/" in server.link and "its trials by avg@4" in server.opens
    # before its first trial, a sweep's ui names the command that makes its store
    (tmp_path / "unrun").mkdir()
    unrun = write_sweep(tmp_path / "unrun", n_trials=1)
    refused = CliRunner().invoke(app, ["ui", str(unrun)])
    assert refused.exit_code == 2 and "no MLflow store" in refused.output and "dapo-ablate sweep" in refused.output


@pytest.mark.parametrize("queued", [False, True], ids=["new", "queued"])
def test_a_driver_killed_inside_ask_leaves_a_trial_the_next_driver_recovers(tmp_path, ledger_url, queued):
    from dapo_ablate.ablation.runtime.hosts import this_host

    spec = load_sweep(write_sweep(tmp_path, ledger=ledger_url, n_trials=3, heartbeat={"interval_s": 1, "grace_period_s": 600}))
    SQLLedger(spec.ledger).close()
    dead = f"{this_host().rpartition(':')[0]}:{_dead_pid()}"
    study = studies.open_study(spec, studies.open_storage(spec, driver=dead))
    if queued:  # a retry waiting in the queue is taken, then the driver dies
        study.enqueue_trial({"eps_high": 0.3})
    study.sampler = _KilledWhileSampling()
    with pytest.raises(KeyboardInterrupt):
        studies.ask(study, spec)
    (left,) = trials(spec)
    assert left.state == TrialState.RUNNING and left.system_attrs[studies.DRIVER_ATTR] == dead

    rerun = studies.open_study(spec, studies.open_storage(spec, driver=this_host()))
    assert studies.recover_orphans(rerun) == [left.number]
    found = {t.number: t for t in trials(spec)}
    assert found[left.number].state == TrialState.FAIL
    (retry,) = [t for t in found.values() if t.system_attrs.get("failed_trial") == left.number]
    assert retry.state == TrialState.WAITING
