"""`dapo-ablate train` as a verl user expects it: verl's per-step console lines at `--log-every`,
`--tracking` into MLflow under `run`'s names, an --out of another config refused (and `--force`),
no weight-loading bar with `--no-progress`, and one line saying what it waits on.

Every test trains the tiny built-in task for a step or a few (the built-in policy comes from the
cache, built once)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.cli.main import app
from dapo_ablate.core.config import TrainerConfig
from dapo_ablate.core.policy import builtin_checkpoint, builtin_lock, builtin_recipe, file_lock

from tiny_configs import TINY_TRAINER


COMMAND = str(Path(sys.executable).parent / "dapo-ablate")
STEP_NAMES = ["critic/score/mean", "actor/entropy", "response_length/mean", "actor/pg_clipfrac",
              "actor/pg_clipfrac_high", "actor/pg_clipfrac_low", "timing_s/step"]
VAL_CORE = ["val-core/builtin/acc/mean@4", "val-core/builtin/acc/best@4/mean", "val-core/builtin/acc/maj@4/mean"]
EVENT_WAIT_S = 600  # a guard against a hang, not a time budget


def tiny_config(tmp_path: Path, **schedule: int) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY_TRAINER, "schedule": {**TINY_TRAINER["schedule"], **schedule}}))
    return path


def step_lines(output: str) -> dict[int, dict[str, float]]:
    """step -> {name: value} of each `step:N - name:value - ...` line."""
    lines = {}
    for line in output.splitlines():
        if line.startswith("step:"):
            head, *pairs = line.split(" - ")
            lines[int(head.split(":")[1])] = {name: float(value) for name, value in (p.rsplit(":", 1) for p in pairs)}
    return lines


def test_step_lines_carry_verls_names_at_the_interval(tmp_path):
    config = tiny_config(tmp_path, total_steps=4, eval_every=3)
    result = CliRunner().invoke(app, ["train", str(config), "--out", str(tmp_path / "out"), "--log-every", "2",
                                      "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = step_lines(result.output)
    # every 2nd step, the evaluation after step 3 and the last step; step 0 is the first evaluation
    assert sorted(lines) == [0, 2, 3, 4], result.output
    assert list(lines[0]) == VAL_CORE
    assert list(lines[2]) == STEP_NAMES
    assert list(lines[3]) == STEP_NAMES + VAL_CORE and list(lines[4]) == STEP_NAMES + VAL_CORE
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    signals = {row["step"]: row for row in saved["signals"]}
    assert lines[2]["critic/score/mean"] == pytest.approx(signals[2]["reward"], abs=1e-4)
    assert lines[4]["actor/pg_clipfrac"] == pytest.approx(signals[4]["clipfrac_low"] + signals[4]["clipfrac_high"], abs=2e-4)
    assert lines[3]["val-core/builtin/acc/mean@4"] == pytest.approx(saved["eval"][1]["avg@4"], abs=1e-4)
    assert lines[2]["timing_s/step"] > 0


def test_tracking_logs_one_run_with_the_names_run_uses(tmp_path):
    from mlflow import MlflowClient

    config = tiny_config(tmp_path, total_steps=2, eval_every=0)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = CliRunner().invoke(app, ["train", str(config), "algorithm.eps_high=0.3", "--out", str(tmp_path / "out"),
                                      "--tracking", uri, "--no-progress"])
    assert result.exit_code == 0, result.output
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tiny")  # named after the config file
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.params["algorithm.eps_high"] == "0.3" and run.data.params["schedule.total_steps"] == "2"

    def steps(name: str) -> list[int]:
        return sorted(point.step for point in client.get_metric_history(run.info.run_id, name))

    for name in ("critic/score/mean", "actor/entropy", "response_length/mean", "actor/pg_clipfrac", "timing_s/gen"):
        assert steps(name) == [1, 2], name
    assert steps("val-core/builtin/acc/mean_at_4") == [0, 2]
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert run.data.metrics["val-core/builtin/acc/mean_at_4"] == pytest.approx(saved["eval"][-1]["avg@4"])
    assert run.data.metrics["perf/steps"] == 2


def test_another_config_into_the_same_out_is_refused_and_force_starts_over(tmp_path):
    config, out = tiny_config(tmp_path, total_steps=1, eval_every=0), tmp_path / "out"
    runner = CliRunner()
    first = runner.invoke(app, ["train", str(config), "--out", str(out), "--no-progress"])
    assert first.exit_code == 0, first.output
    (out / "notes.txt").write_text("mine")
    before = {name: (out / name).read_bytes() for name in ("config.json", "result.json")}

    refused = runner.invoke(app, ["train", str(config), "algorithm.eps_high=0.3", "--out", str(out), "--no-progress"])
    assert refused.exit_code == 2, refused.output
    message = refused.output.strip().splitlines()[-1]
    assert message.startswith("error: ") and "Traceback" not in refused.output
    assert "algorithm.eps_high 0.28 -> 0.3" in message and "--force" in message, message
    assert {name: (out / name).read_bytes() for name in before} == before

    same = runner.invoke(app, ["train", str(config), "--out", str(out), "--no-progress"])
    assert same.exit_code == 0, same.output  # the same config trains there as before

    forced = runner.invoke(app, ["train", str(config), "algorithm.eps_high=0.3", "--out", str(out), "--force",
                                 "--no-progress"])
    assert forced.exit_code == 0, forced.output
    assert json.loads((out / "result.json").read_text())["config"]["algorithm"]["eps_high"] == 0.3
    assert json.loads((out / "config.json").read_text())["algorithm"]["eps_high"] == 0.3
    assert (out / "notes.txt").read_text() == "mine"


def test_no_progress_shows_no_weight_loading_bar(tmp_path):
    config = tiny_config(tmp_path, total_steps=1, eval_every=0)
    done = subprocess.run([COMMAND, "train", str(config), "--out", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, timeout=EVENT_WAIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Loading weights" not in done.stdout + done.stderr, done.stderr
    assert sorted(step_lines(done.stdout)) == [0, 1]  # the step lines stay


def test_a_wait_on_another_process_building_the_policy_is_said_once(tmp_path, monkeypatch):
    config_path = tiny_config(tmp_path, total_steps=1, eval_every=0)
    data = yaml.safe_load(config_path.read_text())  # a policy the package does not ship: it is built
    config_path.write_text(yaml.safe_dump({**data, "model": {**data["model"], "builtin_warmup_steps": 3}}))
    config = TrainerConfig(**yaml.safe_load(config_path.read_text()))
    built = builtin_checkpoint(builtin_recipe(config.model, config.data.builtin_task))  # the shared cache's
    cache = tmp_path / "cache"
    monkeypatch.setenv("DAPO_ABLATE_CACHE", str(cache))
    lock = builtin_lock(builtin_recipe(config.model, config.data.builtin_task))
    assert lock.parent == cache
    cache.mkdir()
    lines: queue.Queue[str | None] = queue.Queue()
    with file_lock(lock):  # as a process building the policy holds it
        process = subprocess.Popen([COMMAND, "train", str(config_path), "--out", str(tmp_path / "out"), "--no-progress"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put(None)], daemon=True).start()
        seen = []
        while not seen or "waiting for" not in seen[-1]:
            line = lines.get(timeout=EVENT_WAIT_S)
            assert line is not None, "".join(seen)  # it ended without waiting
            seen.append(line)
        assert seen[-1].strip() == f"waiting for the built-in policy build held by process {os.getpid()} ({lock}) ..."
        staging = cache / ".building-test"
        shutil.copytree(built, staging)  # the holder finishes its build ...
        os.replace(staging, lock.with_suffix(""))
    # ... and releases the lock: the command goes on with the policy it built
    assert process.wait(timeout=EVENT_WAIT_S) == 0
    rest = [line for line in iter(lambda: lines.get(timeout=EVENT_WAIT_S), None)]
    output = "".join(seen + rest)
    assert output.count("waiting for") == 1, output
    assert sorted(step_lines(output)) == [0, 1], output


def test_a_tracking_store_that_cannot_be_opened_names_the_option(tmp_path: Path):
    from dapo_ablate.ablation.app.errors import UserError
    from dapo_ablate.ablation.app.train_tracking import open_train_run

    garbage = tmp_path / "mlflow.db"
    garbage.write_bytes(b"not a database" * 100)
    with pytest.raises(UserError, match="could not open the MLflow tracking store .*; check --tracking$"):
        open_train_run(f"sqlite:///{garbage}", "tiny", TrainerConfig(**TINY_TRAINER), tmp_path / "out", fresh=True)


def test_the_same_config_into_a_finished_out_returns_its_result_and_trains_nothing(tmp_path):
    config = tiny_config(tmp_path, total_steps=1, eval_every=0)
    out = tmp_path / "out"
    first = subprocess.run([COMMAND, "train", str(config), "--out", str(out), "--no-progress",
                            "--tracking", f"sqlite:///{tmp_path / 'mlflow.db'}"],
                           capture_output=True, text=True, timeout=EVENT_WAIT_S)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"logged to MLflow sqlite:///{tmp_path / 'mlflow.db'}: experiment 'tiny', run " in first.stdout
    before = (out / "result.json").read_bytes()
    again = subprocess.run([COMMAND, "train", str(config), "--out", str(out), "--no-progress"],
                           capture_output=True, text=True, timeout=EVENT_WAIT_S)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "holds this config's finished run: nothing to train" in again.stdout
    assert not step_lines(again.stdout)  # no step trained
    assert (out / "result.json").read_bytes() == before
    assert again.stdout.strip().splitlines()[-1] == first.stdout.strip().splitlines()[-1]  # the same closing line
