"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_verl_results.py
describes; its docstring says what they check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from dapo_ablate.ablation.experiment.identity import RunSpec
from dapo_ablate.ablation.runtime.backends.verl import job_env
from dapo_ablate.ablation.runtime.backends.verl_results import (
    IncompleteRun,
    result_from_mlflow,
)
from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.core.config import build_trainer_config

from support import HANG_GUARD_S, ROOT

pytestmark = pytest.mark.verl_env  # the verl environment's python, from this one (.ci/run's verl part)


VERL_STEPS = r"""
def validation(step):  # 32 samples per problem: val-core at k = 32 (verl's _val_metrics_update)
    acc = 0.25 + 0.05 * step
    return {"val-core/math_dapo/acc/mean@32": acc, "val-core/math_dapo/acc/best@32/mean": acc + 0.4,
            "val-core/math_dapo/acc/maj@32/mean": acc + 0.1, "val-core/math_dapo/acc/best@32/std": 0.01,
            "val-aux/math_dapo/acc/mean@16": acc, "val-aux/math_dapo/reward/mean@32": 2 * acc - 1}

log(validation(0), step=0)  # val_before_train
for step in (1, 2, 3, 4):
    metrics = {"critic/score/mean": -0.5 + 0.1 * step, "actor/entropy": 1.0 / step, "actor/pg_clipfrac": 0.01 * step,
               "actor/ppo_kl": 0.001, "actor/grad_norm": 0.5, "actor/lr": 1e-6, "response_length/mean": 1000.0 * step,
               "response_length/clip_ratio": 0.1, "timing_s/gen": 30.0, "timing_s/update_actor": 20.0,
               "timing_s/step": 60.0, "perf/total_num_tokens": 5e6, "critic/advantages/mean": 0.0}
    if step % 2 == 1:  # Dynamic Sampling dropped groups at this step
        metrics["training/filter_groups/evicted_samples"] = 100
    if step % 2 == 0:  # test_freq=2: validated in the same step, timed as 'testing'
        metrics |= validation(step) | {"timing_s/testing": 7.0 + step}
    log(metrics, step=step)
"""

VERL_CONFIG = {"data": {"train_batch_size": 512, "seed": 0}, "actor_rollout_ref": {"actor": {"clip_ratio_high": 0.28}},
               "trainer": {"logger": ["console", "mlflow"], "project_name": "paper"}}

STAND_IN_FOR_VERL = r"""
import os
import mlflow

def log(metrics, step):  # verl's _MlflowLoggingAdapter.log: '@' -> '_at_', then log_metrics
    mlflow.log_metrics({key.replace("@", "_at_"): value for key, value in metrics.items()}, step=step)

mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"])
mlflow.log_params({"data/train_batch_size": 512, "data/seed": 0, "actor_rollout_ref/actor/clip_ratio_high": 0.28})
""" + VERL_STEPS + "mlflow.end_run()\n"

IN_VERL = r"""
import json, site, sys
site.addsitedir(sys.argv[1])  # mlflow from the main environment, after verl's own packages
from verl.utils.tracking import Tracking

tracking = Tracking("paper", "cell", default_backend=["mlflow"], config=json.loads(sys.argv[2]))
assert "mlflow" in tracking.logger, "verl went on without MLflow"
log = tracking.log
""" + VERL_STEPS + "tracking.finish()\n"


def log_like_verl(logger: str, env: dict[str, str]) -> None:
    """Run the stand-in, or verl's own `Tracking` in the verl environment, with `env`."""
    if logger == "stand-in":
        command = [sys.executable, "-c", STAND_IN_FOR_VERL]
    else:
        python = os.environ.get("DAPO_VERL_PYTHON", "")
        if not python or not Path(python).is_file():
            if os.environ.get("DAPO_REQUIRE_VERL") == "1":
                pytest.fail(f"DAPO_REQUIRE_VERL=1 but DAPO_VERL_PYTHON ({python!r}) is not a python with verl installed")
            pytest.skip("no verl environment (set DAPO_VERL_PYTHON to its python; .ci/run builds one)")
        command = [python, "-c", IN_VERL, sysconfig.get_paths()["purelib"], json.dumps(VERL_CONFIG)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]


def paper_cell() -> dict:
    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import load_spec

    return expand(load_spec(ROOT / "examples" / "paper_verl.yaml")).runs[0].config.to_dict()


@pytest.mark.parametrize("logger", ["stand-in", "verl"])
def test_a_verl_run_in_mlflow_reads_back_as_the_ledger_result(logger: str, tmp_path: Path):
    from mlflow import MlflowClient
    from mlflow.entities import Param

    from dapo_ablate.ablation.store.tracking import flatten

    config = paper_cell()
    config["schedule"]["total_steps"] = 4  # what was logged below: the run trained to its end
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    child = client.create_run(client.create_experiment("paper"), run_name="cell 11111 seed 0")  # the driver's child,
    run_id = child.info.run_id  # with the driver's params (dotted), beside which verl logs its own (slashed)
    params = [Param(key, str(value)) for key, value in {**flatten(config), "seed": 0}.items()]
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start:start + 100])
    env = {**job_env(build_trainer_config(config), uri), "MLFLOW_RUN_ID": run_id}
    log_like_verl(logger, {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env})
    assert client.get_run(run_id).data.params["data/train_batch_size"] == "512"  # verl attached to the child

    result = result_from_mlflow(uri, run_id, wall_s=3600.0, config=config)

    def acc(step: int) -> float:
        return 0.25 + 0.05 * step

    assert result["eval_curve"] == [
        {"step": 0, "avg@32": acc(0), "pass@32": acc(0) + 0.4, "maj@32": acc(0) + 0.1},
        {"step": 2, "avg@32": acc(2), "pass@32": acc(2) + 0.4, "maj@32": acc(2) + 0.1, "time_eval_s": 9.0},
        {"step": 4, "avg@32": acc(4), "pass@32": acc(4) + 0.4, "maj@32": acc(4) + 0.1, "time_eval_s": 11.0},
    ]
    assert result["metrics"] == {"avg@32": acc(4), "pass@32": acc(4) + 0.4, "maj@32": acc(4) + 0.1,
                                 "time_eval_s": 11.0, "steps": 4}
    assert [signal["step"] for signal in result["signals"]] == [1, 2, 3, 4]
    assert result["signals"][1] == {  # the trainer's keys (metric_names.STEP_NAMES read backwards)
        "step": 2, "reward": pytest.approx(-0.3), "entropy": 0.5, "pg_clipfrac": 0.02, "approx_kl": 0.001,
        "grad_norm": 0.5, "lr": 1e-6, "response_length": 2000.0, "truncation_rate": 0.1,
        "time_rollout_s": 30.0, "time_update_s": 20.0,
    }
    # the paper's cell: 512 prompts x 16 responses a step; 100 groups dropped at steps 1 and 3
    assert (config["batch"]["prompts_per_step"], config["algorithm"]["group_size"]) == (512, 16)
    trained = 512 * 16 * 1000 * (1 + 2 + 3 + 4)
    discarded = 100 * 16 * 1000 * (1 + 3)
    assert (result["tokens_generated"], result["tokens_discarded"]) == (trained + discarded, discarded)
    assert result["wall_s"] == 3600.0

    with SQLLedger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:  # the shape the ledger stores
        ledger.ensure_experiment("paper", {})
        ledger.add_runs("paper", [RunSpec("r1", "11111", {}, 0, config)])
        assert ledger.claim("r1", "a:1") and ledger.finish("r1", result)
        stored = ledger.results("paper")[0]
    assert (stored["metrics"], stored["eval_curve"], stored["tokens_generated"]) == (
        result["metrics"], result["eval_curve"], result["tokens_generated"])

    assert result_from_mlflow(uri, run_id)["wall_s"] > 0  # without the job's duration: the run's own span

    short = {**config, "schedule": {**config["schedule"], "total_steps": 400}}  # verl exited 0 after 4 of 400 steps
    with pytest.raises(RuntimeError, match="verl's job ended after 4 of 400 training steps .*ValueError: boom"):
        result_from_mlflow(uri, run_id, wall_s=1.0, config=short, job_log="step 4\nValueError: boom")

    empty = client.create_run(client.get_experiment_by_name("paper").experiment_id).info.run_id
    with pytest.raises(RuntimeError, match=f"verl logged no validation .* into MLflow run {empty}"):
        result_from_mlflow(uri, empty, wall_s=1.0, config=config)  # never recorded as a result without metrics


def test_result_from_mlflow_names_the_run_when_the_final_validation_is_missing(tmp_path):
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from dapo_ablate.ablation.store.metric_names import mlflow_safe

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("paper")).info.run_id
    logged = [("val-core/openai/gsm8k/acc/mean@32", 0, 0.1), ("val-core/openai/gsm8k/acc/mean@32", 1, 0.2),
              ("critic/score/mean", 1, 0.0), ("critic/score/mean", 2, 0.1)]
    client.log_batch(run_id, metrics=[Metric(mlflow_safe(name), value, 0, step) for name, step, value in logged])
    with pytest.raises(IncompleteRun, match=f"final step 2 .*MLflow run {run_id}.*not recorded.*log: boom"):
        result_from_mlflow(client.tracking_uri, run_id, wall_s=1.0, job_log="boom")
