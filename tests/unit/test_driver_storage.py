"""What `sweeps.driver_storage` relies on in Optuna, checked against the installed Optuna, on SQLite
and PostgreSQL: an upgrade that changes one of these fails here, not in a sweep that leaves a
running trial naming no driver.

- pyproject.toml pins Optuna to the releases this was run on, and the installed one is among them;
- ``RDBStorage._create_new_trial(study_id, template_trial=None) -> FrozenTrial`` still exists with
  that signature, and ``Study.ask`` (through Optuna's cached storage) creates a trial through it:
  the trial names its driver without any later write;
- ``Study.ask`` takes a queued trial through ``set_trial_state_values(..., RUNNING)``."""

from __future__ import annotations

import inspect
import tomllib
from typing import Any

import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from packaging.requirements import Requirement
from packaging.version import Version

from dapo_ablate.sweeps.driver_storage import DRIVER_ATTR, DriverStorage
from dapo_ablate.sweeps.study import storage_url

from support import ROOT

DRIVER = "host-a:4242"


class _Recording(DriverStorage):
    """A driver's storage that records every system-attr write made after a trial's creation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.later_writes: list[tuple[int, str, Any]] = []

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.later_writes.append((trial_id, key, value))
        super().set_trial_system_attr(trial_id, key, value)


class _KilledWhileSampling(optuna.samplers.RandomSampler):
    """A driver killed inside ``Study.ask``, after the trial's creation and before its knobs."""

    def before_trial(self, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt


def _study(ledger_url: str, **kwargs: Any) -> tuple[_Recording, optuna.Study]:
    storage = _Recording(storage_url(ledger_url), driver=DRIVER)
    return storage, optuna.create_study(study_name="driver-storage", storage=storage, **kwargs)


def _stored(ledger_url: str) -> list[FrozenTrial]:
    """The study's trials as another process reads them (a plain storage, no cache)."""
    return optuna.load_study(study_name="driver-storage", storage=RDBStorage(storage_url(ledger_url))).get_trials()


def test_optuna_is_pinned_to_the_releases_run_and_one_of_them_is_installed():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (optuna_req,) = [Requirement(d) for d in dependencies if Requirement(d).name == "optuna"]
    uppers = [s for s in optuna_req.specifier if s.operator in ("<", "<=", "==", "~=")]
    assert uppers, f"pyproject.toml's {optuna_req} has no upper bound: an untested Optuna could install"
    assert Version(optuna.__version__) in optuna_req.specifier, (
        f"Optuna {optuna.__version__} is outside pyproject.toml's {optuna_req}: re-check sweeps/driver_storage.py "
        "against it (this file), then widen the pin")


def test_the_private_method_overridden_keeps_its_signature():
    signature = inspect.signature(RDBStorage._create_new_trial)
    assert list(signature.parameters) == ["self", "study_id", "template_trial"]
    assert signature.parameters["template_trial"].default is None
    assert inspect.signature(DriverStorage._create_new_trial).parameters.keys() == signature.parameters.keys()
    taking = inspect.signature(RDBStorage.set_trial_state_values)
    assert list(taking.parameters)[:3] == ["self", "trial_id", "state"]


def test_a_new_trial_names_its_driver_from_the_write_that_creates_it(ledger_url):
    storage, study = _study(ledger_url)
    study.sampler = _KilledWhileSampling()
    with pytest.raises(KeyboardInterrupt):
        study.ask()
    (left,) = _stored(ledger_url)
    assert left.state == TrialState.RUNNING and left.system_attrs.get(DRIVER_ATTR) == DRIVER
    assert storage.later_writes == []  # no write after the insert: it came with the trial

    storage.later_writes.clear()
    study.sampler = optuna.samplers.RandomSampler(seed=0)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    assert _stored(ledger_url)[trial.number].system_attrs.get(DRIVER_ATTR) == DRIVER
    assert storage.later_writes == []


def test_a_queued_trial_names_its_driver_when_it_is_taken(ledger_url):
    storage, study = _study(ledger_url)
    study.enqueue_trial({"x": 0.25})
    (queued,) = _stored(ledger_url)
    assert queued.state == TrialState.WAITING and DRIVER_ATTR not in queued.system_attrs

    trial = study.ask()
    assert trial.number == queued.number  # the queued trial was taken, not a new one created
    (taken,) = _stored(ledger_url)
    assert taken.state == TrialState.RUNNING and taken.system_attrs.get(DRIVER_ATTR) == DRIVER
    assert storage.later_writes == [(queued._trial_id, DRIVER_ATTR, DRIVER)]
