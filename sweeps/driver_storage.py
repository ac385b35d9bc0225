"""The one place a sweep relies on Optuna's internals: a storage whose trials name their driver.

A sweep's driver (``hostname:pid``) must be named by every trial it runs, from the write that
creates the trial (`sweeps.study` explains why: a driver killed while Optuna's ``ask`` samples
the knobs would otherwise leave a running trial that names nobody). Optuna has no public hook
for that. Its public ways to write a trial's attributes (``set_trial_system_attr``,
``Trial.set_user_attr``) are writes *after* the one that creates it, and ``Study.ask`` takes no
template. So `DriverStorage` overrides what ``Study.ask`` goes through, which in Optuna 5.1 is:

- ``RDBStorage._create_new_trial(study_id, template_trial=None) -> FrozenTrial``: the single
  path by which ``RDBStorage.create_new_trial`` and the cache Optuna puts in front of every RDB
  storage (``optuna.storages._CachedStorage.create_new_trial``) insert a trial; ``Study.ask``
  passes no template for a new trial, and a template's ``system_attrs`` are written by the same
  transaction as the trial;
- ``set_trial_state_values(trial_id, TrialState.RUNNING)`` returning True: how ``Study.ask``
  takes a queued (WAITING) trial.

`tests/unit/test_driver_storage.py` checks each of these against the installed Optuna, so an
upgrade that changes one fails there, not in a sweep; pyproject.toml pins Optuna to the releases
it was run on.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

DRIVER_ATTR = "dapo.driver"
"""Trial system attr: ``hostname:pid`` of the driver that asked the trial."""


class DriverStorage(RDBStorage):
    """The RDB storage of one driver (``hostname:pid``): each trial it starts running names it."""

    def __init__(self, *args: Any, driver: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.driver = driver

    def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> FrozenTrial:
        # Optuna-internal (see the module docstring): a new trial of `Study.ask` comes without a
        # template; giving it one writes the driver in the transaction that inserts the trial.
        if template_trial is None:
            template_trial = FrozenTrial(
                number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(), datetime_complete=None,
                params={}, distributions={}, user_attrs={}, system_attrs={DRIVER_ATTR: self.driver},
                intermediate_values={}, trial_id=-1,
            )
        return super()._create_new_trial(study_id, template_trial)

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        taken = super().set_trial_state_values(trial_id, state, values)
        if taken and state == TrialState.RUNNING:  # a queued trial taken by `Study.ask`
            self.set_trial_system_attr(trial_id, DRIVER_ATTR, self.driver)
        return taken
