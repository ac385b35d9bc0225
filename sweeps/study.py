"""The Optuna side of a sweep: storage, study, sampler, pruner, the trial budget, heartbeats.

The study lives in Optuna's RDB storage on the ledger's database (SQLite by default, PostgreSQL
for clusters), named after the sweep, so rerunning `dapo-ablate sweep` resumes it.

Trials are driven with Optuna's ask/tell interface, not `study.optimize`, because a trial's runs
are Ray tasks and several trials are in flight at once. `optimize` would run Optuna's heartbeat
thread and its stale-trial check for us; with ask/tell the driver does both itself:

- every `heartbeat.interval_s` it records the heartbeat of each trial it is running
  (`RDBStorage.record_heartbeat`) and calls `optuna.storages.fail_stale_trials`, which fails
  any *running* trial whose heartbeat is older than `heartbeat.grace_period_s` and hands it to
  the storage's `heartbeat_stale_trial_callback`, a `RetryHeartbeatStaleTrialCallback` that
  queues a copy of it (same params, state WAITING) for the next `ask`;
- at start-up, running trials asked by a driver on this host whose process is gone are failed
  and queued the same way at once, without waiting for the grace period (`recover_orphans`).

That needs every running trial to name its driver, so a driver's storage (`open_storage(...,
driver=)`: `sweeps.driver_storage`, the one place that relies on Optuna's internals) writes it
with the trial: a new trial carries it from the write that creates it, a queued one from the
write right after it is taken. Optuna's ``ask`` then samples the knobs, which
can take seconds; a driver killed meanwhile used to leave a running trial that named nobody, was
never recovered and held a place in the budget for good. The one window left (a queued trial
taken, its driver killed before the next write) is closed by `fail_stale`: a running trial that
names no driver after the grace period is failed and queued again too.

The budget: ``n_trials`` finished trials, counting complete, pruned and failed ones but not a
failed trial that was queued again (its retry stands in for it): see `counted_trials`.
"""

from __future__ import annotations

import copy
import math
import os
from datetime import datetime, timedelta
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from dapo_ablate.ablation.store.database import with_psycopg_driver
from dapo_ablate.ablation.runtime.hosts import pid_alive
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.tracking import sqlite_path
from dapo_ablate.core.contracts import METRIC_PATTERN
from dapo_ablate.sweeps.driver_storage import DRIVER_ATTR, DriverStorage
from dapo_ablate.sweeps.spec import SweepSpec

ERROR_ATTR = "error"
"""Trial user attr: why a failed trial failed (one line)."""
SQLITE_BUSY_TIMEOUT_S = 30
"""How long the study's SQLite connection waits for the ledger's write lock (same file)."""

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


class StudyError(ValueError):
    """A study the user must fix (e.g. its direction changed under the same name); one sentence."""


def storage_url(ledger_url: str) -> str:
    """The ledger URL as SQLAlchemy spells it for Optuna: plain postgresql:// uses psycopg 3."""
    return with_psycopg_driver(ledger_url)


def open_storage(spec: SweepSpec, *, heartbeat: bool = True, driver: str | None = None) -> RDBStorage:
    """Optuna's RDB storage on the ledger's database (open the `Ledger` first: it creates the
    SQLite folder). heartbeat=False for readers (reports), which never fail anyone's trials;
    a driver (``hostname:pid``) gets a storage whose trials name it from their first write."""
    url = storage_url(spec.ledger)
    if url.startswith("sqlite"):
        engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    else:
        engine_kwargs = {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}
    beat = spec.heartbeat
    try:
        with warnings.catch_warnings():  # the heartbeat API is "experimental" since Optuna 2.8
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if not heartbeat:
                return RDBStorage(url, engine_kwargs=engine_kwargs)
            beating: dict[str, Any] = {
                "heartbeat_interval": beat.interval_s, "grace_period": beat.grace_period_s,
                "heartbeat_stale_trial_callback": RetryHeartbeatStaleTrialCallback(max_retry=beat.max_retry),
            }
            if driver is None:
                return RDBStorage(url, engine_kwargs=engine_kwargs, **beating)
            return DriverStorage(url, engine_kwargs=engine_kwargs, driver=driver, **beating)
    except Exception as err:  # sqlalchemy / driver errors: the user's database URL or server
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise LedgerError(f"could not open the Optuna study storage at {spec.ledger} ({first}); check `ledger:`") from None


def make_sampler(spec: SweepSpec) -> optuna.samplers.BaseSampler:
    sampler = spec.sampler
    if sampler.type == "grid":
        from dapo_ablate.sweeps.spec import grid_values

        return _AskTellGridSampler({leaf: grid_values(dim) for leaf, dim in spec.space.items()}, seed=sampler.seed)
    if sampler.type == "random":
        return _PerTrialRandomSampler(seed=sampler.seed)
    # constant_liar: trials in flight count as (pessimistically) finished, so concurrent asks
    # spread out instead of piling onto one promising point.
    return _PerTrialTPESampler(seed=sampler.seed, n_startup_trials=sampler.n_startup_trials, constant_liar=True)


def trial_seed(seed: int, number: int) -> int:
    """The random state of trial ``number`` of a study seeded ``seed`` (independent streams)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


class _PerTrialSeed:
    """Reseed the sampler's random state from (seed, trial number) before each trial.

    Optuna seeds a sampler once, when it is built: a sweep resumed after a kill rebuilds it with
    the same seed and replays the first draws (4 trials, 2 distinct settings after one kill).
    Seeded per trial number, trial n draws what a fresh study's trial n would (given the same
    finished trials, for TPE), whatever invocation asks for it.
    """

    def __init__(self, *args, seed: int | None = None, **kwargs) -> None:
        super().__init__(*args, seed=seed, **kwargs)
        self._base_seed = seed

    def before_trial(self, study, trial) -> None:  # noqa: ANN001 - Optuna's signature
        super().before_trial(study, trial)
        if self._base_seed is not None:
            self._reseed(trial_seed(self._base_seed, trial.number))

    def _reseed(self, value: int) -> None:
        self._rng.rng.seed(value)


class _PerTrialRandomSampler(_PerTrialSeed, optuna.samplers.RandomSampler):
    pass


class _PerTrialTPESampler(_PerTrialSeed, optuna.samplers.TPESampler):
    def _reseed(self, value: int) -> None:
        self._rng.rng.seed(value)
        self._random_sampler._rng.rng.seed(value)  # the start-up trials' sampler


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler without its `after_trial`, which calls `study.stop()` once the grid is
    exhausted, and Optuna allows that only inside `optimize`. The driver's budget ends the sweep
    instead: the spec keeps n_trials at most the grid's size."""

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001 - Optuna's signature
        pass


def make_pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    pruner = spec.pruner
    if pruner.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruner.n_startup_trials, n_warmup_steps=pruner.n_warmup_steps)
    if pruner.type == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=pruner.min_resource, reduction_factor=pruner.reduction_factor)
    return optuna.pruners.NopPruner()


def open_study(spec: SweepSpec, storage: RDBStorage) -> optuna.Study:
    """Create the sweep's study or load it (resume); refuse a changed direction."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.create_study(
            study_name=spec.name, storage=storage, sampler=make_sampler(spec), pruner=make_pruner(spec),
            direction=spec.direction, load_if_exists=True,
        )
    except ValueError as err:
        if "direction" not in str(err).lower():
            raise
        raise StudyError(
            f"the study {spec.name!r} in {spec.ledger} was created with another direction than {spec.direction}; "
            "restore `direction:` or give the sweep a new name"
        ) from None


SPACE_ATTR = "dapo.space"
"""Study user attr: the search space the study was created with (leaf -> its dimension's fields)."""
METRIC_ATTR = "dapo.metric"


def space_of(spec: SweepSpec) -> dict[str, dict[str, Any]]:
    """The spec's search space as the study stores it (`SPACE_ATTR`)."""
    return {leaf: dim.model_dump(mode="json") for leaf, dim in spec.space.items()}


def check_resumable(study: optuna.Study, spec: SweepSpec) -> None:
    """Refuse to resume a study whose trials were drawn from another search space or judged by
    another metric: old and new trials would mix in one ranking (a best value from outside the
    new range), or with a trial no sweep of it wrote (`check_trials`). StudyError naming the
    difference; a new study has nothing stored yet."""
    stored = study.user_attrs.get(SPACE_ATTR)
    changes = space_changes(stored, space_of(spec)) if stored is not None else []
    metric = study.user_attrs.get(METRIC_ATTR)
    if metric is not None and metric != spec.metric:
        changes.append(f"metric {metric} -> {spec.metric}")
    if changes:
        raise StudyError(
            f"the study {spec.name!r} in {spec.ledger} was run with another search space ({'; '.join(changes[:4])}); "
            "restore `space:` and `metric:`, or give the sweep a new name to start a new study"
        )
    check_trials(study, spec)


def space_changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between two stored search spaces, one phrase per knob: added, removed, or
    each changed field with both values (``eps_high: high 0.5 -> 0.6``)."""
    changes = [f"{leaf} added" for leaf in after if leaf not in before]
    changes += [f"{leaf} removed" for leaf in before if leaf not in after]
    for leaf in [leaf for leaf in after if leaf in before]:
        old, new = before[leaf], after[leaf]
        fields = [f"{key} {old.get(key)} -> {new.get(key)}" for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
        if fields:
            changes.append(f"{leaf}: {', '.join(fields)}")
    return changes


def load_study(spec: SweepSpec) -> optuna.Study:
    """The sweep's study for reading (no heartbeat); StudyError if it was never run. Creates
    nothing: a SQLite ledger that does not exist yet is not made."""
    path = sqlite_path(spec.ledger)
    if path is not None and not path.is_file():
        raise StudyError(f"no study named {spec.name!r} yet ({spec.ledger} does not exist); run `dapo-ablate sweep` first")
    storage = open_storage(spec, heartbeat=False)
    try:
        study = optuna.load_study(study_name=spec.name, storage=storage)
    except KeyError:
        raise StudyError(f"no study named {spec.name!r} in {spec.ledger} yet; run `dapo-ablate sweep` first") from None
    check_trials(study, spec)
    return study


_EDITED = "restore the row, or give the sweep another name to start a new study"


def check_trials(study: optuna.Study, spec: SweepSpec) -> None:
    """Every trial of the study reads back as a sweep of `spec` writes it: each knob's value in
    the spec's space, and a complete trial's value a finite number (an accuracy in [0, 1]).
    StudyError naming the trial otherwise: a row edited by hand (a choice index past the list
    raised an IndexError, an unknown distribution a ValueError; a value of 99 was the best
    trial at 9900 pp, a knob outside the space its best setting)."""
    try:
        trials = study.get_trials(deepcopy=False)
    except (ValueError, IndexError, KeyError, TypeError) as err:  # Optuna's own parse of the rows
        raise StudyError(f"the study {spec.name!r} in {spec.ledger} holds a trial row Optuna cannot read "
                         f"({type(err).__name__}: {err}); {_EDITED}") from None
    space = distributions(spec)
    for trial in trials:
        problem = _trial_problem(trial, space, spec.metric)
        if problem:
            raise StudyError(f"trial {trial.number} of the study {spec.name!r} in {spec.ledger} {problem}: no sweep of "
                             f"this spec wrote it (the row was edited); {_EDITED}")


def _trial_problem(trial: FrozenTrial, space: dict[str, BaseDistribution], metric: str) -> str | None:
    for name, value in trial.params.items():
        if name not in space:
            return f"has the knob {name!r}, which the sweep does not search"
        try:
            inside = space[name]._contains(space[name].to_internal_repr(value))
        except (ValueError, TypeError):
            inside = False
        if not inside:
            return f"has {name} = {value!r}, outside the sweep's space"
    if trial.state == TrialState.COMPLETE:
        value = trial.value
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"has the value {value!r}, not a finite number"
        if METRIC_PATTERN.match(metric) and not 0 <= value <= 1:
            return f"has {metric} = {value!r}, but an accuracy is a fraction in [0, 1]"
    return None


def distributions(spec: SweepSpec) -> dict[str, BaseDistribution]:
    """Each searched knob's Optuna distribution, by leaf name (the trial's parameter names)."""
    out: dict[str, BaseDistribution] = {}
    for leaf, dim in spec.space.items():
        if dim.type == "categorical":
            out[leaf] = CategoricalDistribution(dim.choices)
        elif dim.type == "int":
            out[leaf] = IntDistribution(int(dim.low), int(dim.high), log=dim.log, step=int(dim.step or 1))
        else:
            out[leaf] = FloatDistribution(float(dim.low), float(dim.high), log=dim.log, step=dim.step)
    return out


def ask(study: optuna.Study, spec: SweepSpec) -> optuna.Trial:
    """A new (or queued) trial with every knob sampled and its heartbeat started; on a driver's
    storage (`open_storage(..., driver=)`) it names its driver from its first write."""
    with warnings.catch_warnings():  # "Heartbeat ... supposed to be used with Study.optimize": we beat ourselves
        warnings.filterwarnings("ignore", message=".*Heartbeat.*")
        trial = study.ask(fixed_distributions=distributions(spec))
    study._storage.record_heartbeat(trial._trial_id)
    return trial


def retried_numbers(trials: Sequence[FrozenTrial]) -> set[int]:
    """Numbers of failed trials that were queued again as a new trial (their retry stands in)."""
    return {number for t in trials for number in t.system_attrs.get("retry_history", [])}


def counted_trials(trials: Sequence[FrozenTrial]) -> int:
    """Finished trials that count towards n_trials: complete, pruned, and failed unless retried."""
    retried = retried_numbers(trials)
    return sum(t.state in FINISHED and not (t.state == TrialState.FAIL and t.number in retried) for t in trials)


def may_ask(study: optuna.Study, n_trials: int) -> bool:
    """True while the budget has room: a queued trial is waiting, or counted + running < n_trials."""
    trials = study.get_trials(deepcopy=False)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    running = sum(t.state == TrialState.RUNNING for t in trials)
    return waiting > 0 or counted_trials(trials) + running < n_trials


def fail_and_requeue(study: optuna.Study, trial_id: int, reason: str) -> bool:
    """Fail a running trial with `reason` and queue it again through the storage's stale-trial
    callback (as Optuna's heartbeat would); False if it had finished meanwhile."""
    storage = study._storage
    try:
        storage.set_trial_user_attr(trial_id, ERROR_ATTR, reason)
        if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
            return False
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    callback = storage.get_heartbeat_stale_trial_callback()
    if callback is not None:
        retry = copy.deepcopy(storage.get_trial(trial_id))
        retry.user_attrs = {k: v for k, v in retry.user_attrs.items() if k != ERROR_ATTR}  # not the retry's
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            callback(study, retry)
    return True


def recover_orphans(study: optuna.Study) -> list[int]:
    """Fail and queue again the running trials whose driver was a process on this host that is
    gone (killed, crashed); their numbers. Others' trials wait for the heartbeat's grace period."""
    from dapo_ablate.ablation.runtime.hosts import this_host

    hostname, recovered = this_host().rpartition(":")[0], []  # host and PID namespace, as drivers record them
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        holder, _, pid = str(trial.system_attrs.get(DRIVER_ATTR, "")).rpartition(":")
        if holder == hostname and pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            if fail_and_requeue(study, trial._trial_id, f"its driver {holder}:{pid} stopped; queued again"):
                recovered.append(trial.number)
    return recovered


def fail_stale(study: optuna.Study, grace_period_s: float) -> list[int]:
    """Optuna's heartbeat check: stale running trials are failed and queued again. So is a running
    trial that names no driver ``grace_period_s`` after it started (its driver was killed as it
    took the trial, before naming itself; Optuna skips a trial without a heartbeat). The numbers of
    the latter."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    cutoff, unclaimed = datetime.now() - timedelta(seconds=grace_period_s), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if DRIVER_ATTR not in trial.system_attrs and trial.datetime_start is not None and trial.datetime_start < cutoff:
            if fail_and_requeue(study, trial._trial_id, "its driver stopped before naming itself; queued again"):
                unclaimed.append(trial.number)
    return unclaimed
