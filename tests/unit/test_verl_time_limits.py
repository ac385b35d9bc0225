"""A verl cell's time limit and retries: no fixed 72 h kill. Each verl cell runs
under its own estimate x `TIME_SAFETY` + `STARTUP_S` unless the spec sets ``executor.run_timeout_s``;
``validate`` prints the limit of every cell; a job lost with a node, its supervisor or past its limit
is resubmitted (within ``executor.retries``), a job whose verl failed is not. No Ray here: the
limits, the loss classification and the retry decision are the product's own functions."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.backends.job_failures import JobFailed, JobLost, lost_reason
from dapo_ablate.ablation.runtime.backends.registry import backend_named, time_limits_of
from dapo_ablate.ablation.runtime.backends.verl_plan import STARTUP_S, TIME_SAFETY, gpu_hours
from dapo_ablate.ablation.runtime.task import describe_error
from dapo_ablate.ablation.runtime.time_limit import TimeLimit
from dapo_ablate.cli.main import app

from support import ROOT

EXAMPLE = ROOT / "examples" / "paper_verl.yaml"


def _spec_file(tmp_path: Path, replace: tuple[str, str] | None = None) -> Path:
    path = tmp_path / "paper_verl.yaml"
    text = EXAMPLE.read_text()
    if replace:
        assert replace[0] in text
        text = text.replace(*replace, 1)
    path.write_text(text)
    return path


def test_a_verl_cells_limit_is_its_own_estimate_times_the_safety_factor_not_72_h(tmp_path: Path):
    spec = load_spec(_spec_file(tmp_path))
    plan = expand(spec)
    limits = time_limits_of(spec, plan)
    assert set(limits) == {run.run_id for run in plan.runs}
    for run in plan.runs:  # the eval file is not on this machine: 30 rows assumed, as the estimate
        wall_h = gpu_hours(run.config) / 128
        assert limits[run.run_id].seconds == pytest.approx(TIME_SAFETY * wall_h * 3600 + STARTUP_S)
    grpo = next(run for run in plan.runs if not any(run.factors.values()))
    dapo = next(run for run in plan.runs if all(run.factors.values()))
    assert limits[grpo.run_id].seconds > 72 * 3600  # a 32B cell at 400 steps: a fixed 72 h would kill it
    assert limits[dapo.run_id].seconds > limits[grpo.run_id].seconds  # dynamic sampling generates more


def test_a_run_timeout_s_the_spec_sets_holds_for_every_verl_cell_null_included(tmp_path: Path):
    for given, seconds in (("  run_timeout_s: 7200\n", 7200.0), ("  run_timeout_s: null\n", None)):
        spec = load_spec(_spec_file(tmp_path, ("  retries: 1\n", "  retries: 1\n" + given)))
        limits = set(time_limits_of(spec, expand(spec)).values())
        assert limits == {TimeLimit(seconds)}


def test_without_a_model_size_a_verl_cell_falls_back_to_run_timeout_s_default_and_says_why(tmp_path: Path):
    spec = load_spec(_spec_file(tmp_path, ("path: /models/Qwen2.5-32B", "path: /models/my-policy")))
    limit = next(iter(time_limits_of(spec, expand(spec)).values()))
    assert limit.seconds == 72 * 3600 and "no estimate without a model size" in limit.source
    assert limit.error() == f"TimeoutError: the run exceeded {limit.source} (259200 s)"


def test_a_builtin_cell_runs_under_run_timeout_s(tmp_path: Path):
    from support import write_spec

    spec = load_spec(write_spec(tmp_path))
    assert time_limits_of(spec, expand(spec)) == {}  # the pool's executor.run_timeout_s
    assert TimeLimit(3).error() == "TimeoutError: the run exceeded executor.run_timeout_s (3 s)"
    assert TimeLimit(None).deadline(5.0) == math.inf and TimeLimit(10).deadline(5.0) == 15.0


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"]])
def test_validate_says_under_which_limit_each_verl_cell_runs(command: list[str], tmp_path: Path, monkeypatch):
    spec_path = _spec_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*command, str(spec_path)])
    assert result.exit_code == 0, result.output
    limits = re.findall(r"^      time limit ([\d,.]+) h \((.+)\)$", result.output, flags=re.M)
    assert len(limits) == 32
    assert all(f"{TIME_SAFETY:g} x the estimated" in source and "executor.run_timeout_s not set" in source for _, source in limits)
    spec = load_spec(spec_path)
    expected = sorted(f"{limit.seconds / 3600:,.1f}" for limit in time_limits_of(spec, expand(spec)).values())
    assert sorted(hours for hours, _ in limits) == expected


@pytest.mark.parametrize("error_type, exit_code, log, lost", [
    ("JOB_SUPERVISOR_ACTOR_DIED", None, "", True),
    ("JOB_ENTRYPOINT_COMMAND_ERROR", 1, "ray.exceptions.ActorDiedError: The actor died because its node has died. Node Id: ab12", True),
    ("JOB_ENTRYPOINT_COMMAND_ERROR", 1, "ray.exceptions.NodeDiedError: node 10.0.0.3 died", True),
    ("JOB_ENTRYPOINT_COMMAND_ERROR", 143, "", True),
    ("JOB_ENTRYPOINT_COMMAND_ERROR", 1, "Traceback (most recent call last):\nValueError: ppo_mini_batch_size must divide", False),
    ("JOB_ENTRYPOINT_COMMAND_ERROR", 137, "torch.OutOfMemoryError: CUDA out of memory", False),  # would fail again
    (None, None, "", False),
])
def test_a_job_lost_with_a_node_is_told_from_one_that_failed(error_type, exit_code, log, lost):
    assert (lost_reason(error_type, exit_code, log) is not None) is lost


def test_verl_resubmits_lost_and_timed_out_jobs_but_not_real_failures_builtin_retries_all_but_timeouts():
    verl, builtin = backend_named("verl"), backend_named("builtin")
    failed = describe_error(JobFailed("Ray job x-a1 ended FAILED; last lines of its log: ValueError: bad lr"))
    lost = describe_error(JobLost("Ray job x-a1 ended FAILED (its supervisor died); last lines of its log: "))
    assert not verl.retries(failed, timed_out=False)
    assert verl.retries(lost, timed_out=False)
    assert verl.retries("TimeoutError: the run exceeded its limit (3600 s)", timed_out=True)
    assert verl.retries("RaySystemError: the watching task's worker died", timed_out=False)  # its job is re-attached to
    assert builtin.retries(failed, timed_out=False) and not builtin.retries("TimeoutError: x", timed_out=True)


def test_an_unset_run_timeout_s_stays_unset_in_the_experiments_record_so_a_rerun_from_its_folder_keeps_the_limits(tmp_path: Path):
    from dapo_ablate.ablation.runtime.executor import record_data

    spec = load_spec(_spec_file(tmp_path))
    record = tmp_path / "record.yaml"
    data = record_data(spec)
    assert "run_timeout_s" not in data["executor"]
    record.write_text(yaml.safe_dump(data))
    again = load_spec(record)
    assert again.digest() == spec.digest() and not again.executor.run_timeout_given
    assert time_limits_of(again, expand(again)) == time_limits_of(spec, expand(spec))
    given = load_spec(_spec_file(tmp_path, ("  retries: 1\n", "  retries: 1\n  run_timeout_s: 7200\n")))
    assert record_data(given)["executor"]["run_timeout_s"] == 7200
