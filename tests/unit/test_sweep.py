"""Sweep mechanics with cheap cell functions on one local Ray (pruning, failures, heartbeat
recovery, resume after a SIGKILL, robustness effects, MLflow, the report), on SQLite and
PostgreSQL; and one end-to-end sweep through the real trainer.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_sweep_e2e.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from dapo_ablate.ablation.store.ledger import SQLLedger
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.spec import load_sweep

from support import TESTS

ROOT = TESTS.parent

TRAINER = {
    "rollout": {"eval_k": 4, "max_response_len": 32},
    "algorithm": {"group_size": 4, "overlong_cache": 8},
    "batch": {"prompts_per_step": 8, "mini_batch_size": 16},
    "schedule": {"total_steps": 6, "eval_every": 2},
}


def write_sweep(tmp_path: Path, ledger: str | None = None, mlflow: str | None = None, **fields: Any) -> Path:
    out = tmp_path / "out"
    data = {
        "name": tmp_path.name, "trainer": TRAINER, "space": {"eps_high": {"low": 0.2, "high": 0.5}},
        "n_trials": 6, "sampler": {"type": "random", "seed": 3}, "pruner": "none",
        "output_dir": str(out), "ledger": ledger or f"sqlite:///{out}/ledger.db",
        "tracking": {"uri": mlflow or f"sqlite:///{out}/mlflow.db"}, "executor": {"retries": 0, "max_concurrent": 2},
    }
    data.update(fields)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def trials(spec) -> list[optuna.trial.FrozenTrial]:
    return studies.load_study(spec).get_trials()


class _KilledWhileSampling(optuna.samplers.RandomSampler):
    """A driver killed inside Optuna's ask: the trial exists, running, and its knobs are not drawn yet."""

    def before_trial(self, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_running_trial_naming_no_driver_is_queued_again_after_the_grace_period(tmp_path, ledger_url):
    spec = load_sweep(write_sweep(tmp_path, ledger=ledger_url, n_trials=3, heartbeat={"interval_s": 1, "grace_period_s": 60}))
    SQLLedger(spec.ledger).close()
    study = studies.open_study(spec, studies.open_storage(spec))  # no driver: as if killed before naming itself
    from datetime import datetime, timedelta

    def unclaimed(age_s: float) -> int:
        return study._storage.create_new_trial(study._study_id, optuna.trial.FrozenTrial(
            number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.now() - timedelta(seconds=age_s),
            datetime_complete=None, params={}, distributions={}, user_attrs={}, system_attrs={},
            intermediate_values={}, trial_id=-1))

    old, young = unclaimed(61), unclaimed(5)
    numbers = {t._trial_id: t.number for t in trials(spec)}
    assert studies.fail_stale(study, spec.heartbeat.grace_period_s) == [numbers[old]]
    found = {t.number: t for t in trials(spec)}
    assert found[numbers[old]].state == TrialState.FAIL and "before naming itself" in found[numbers[old]].user_attrs["error"]
    assert found[numbers[young]].state == TrialState.RUNNING  # perhaps a live driver about to name itself
    assert [t.state for t in found.values() if t.system_attrs.get("failed_trial") == numbers[old]] == [TrialState.WAITING]
