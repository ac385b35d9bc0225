"""What the user watches during a sweep, as a listener of the one `Driver` (a trial's start and end,
told by the sweep's scheduler, and its notes): one line per started and finished trial and, with
``enabled``, a rich progress bar (finished trials of n_trials, running, best so far)."""

from __future__ import annotations

import time

from optuna.trial import FrozenTrial, TrialState

from dapo_ablate.ablation.runtime.driver import RunListener
from dapo_ablate.ablation.runtime.progress import EventLines
from dapo_ablate.core.contracts import metric_text


class TrialDisplay(EventLines, RunListener):
    def __init__(self, total: int, metric: str, direction: str, enabled: bool) -> None:
        super().__init__(enabled)
        self.total, self.metric = total, metric
        self.better = max if direction == "maximize" else min
        self.finished_count = self.running = 0
        self.best: float | None = None
        self.started_at: dict[int, float] = {}

    def __enter__(self) -> TrialDisplay:
        if self.enabled:
            self._start_bar("trials", self.total)
        return self

    def start(self, already_finished: int) -> None:
        self.finished_count = already_finished
        if already_finished:
            self._line(f"resuming: {already_finished} of {self.total} trials already finished")
        self._refresh()

    def trial_started(self, number: int, params: str, runs: int, done: int) -> None:
        """The driver's event (`sweeps.scheduler`): a trial asked and its runs queued."""
        self.started(number, params, runs, done)

    def trial_finished(self, trial: FrozenTrial) -> None:
        """The driver's event (`sweeps.scheduler`): a trial told COMPLETE, PRUNED or FAIL."""
        self.finished(trial)

    def started(self, number: int, params: str, runs: int, done: int) -> None:
        self.started_at[number] = time.monotonic()
        self.running += 1
        reused = f", {done} already in the ledger" if done else ""
        self._line(f"trial {number:<4} started   {params}  ({runs} run{'s' * (runs != 1)}{reused})")

    def finished(self, trial: FrozenTrial) -> None:
        self.finished_count += 1
        started = self.started_at.pop(trial.number, None)
        if started is not None:
            self.running -= 1
        took = f"  {time.monotonic() - started:.0f} s" if started is not None else ""
        if trial.state == TrialState.COMPLETE:
            self.best = trial.value if self.best is None else self.better(self.best, trial.value)
            what = f"complete  {metric_text(trial.value, self.metric)}"
        elif trial.state == TrialState.PRUNED:
            step = trial.user_attrs.get("pruned_at_step")
            value = trial.intermediate_values.get(step)
            shown = f" ({metric_text(value, self.metric)})" if value is not None else ""
            what = f"pruned    at step {step}{shown}"
        else:
            what = f"failed    {trial.user_attrs.get('error', '')}"
        self._line(f"trial {trial.number:<4} {what}{took}")

    def _refresh(self) -> None:
        if self.bar is not None:
            state = f"running {self.running}" + (f"  best {metric_text(self.best, self.metric)}" if self.best is not None else "")
            self.bar.update(self.task, completed=min(self.finished_count, self.total), state=state)
