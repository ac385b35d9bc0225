"""What the user watches during a sweep: one line per started and finished trial and, with
``enabled``, a rich progress bar (finished trials of n_trials, running, best so far)."""

from __future__ import annotations

import time
from typing import Any

from optuna.trial import FrozenTrial, TrialState


class TrialDisplay:
    def __init__(self, total: int, metric: str, direction: str, enabled: bool) -> None:
        self.total, self.metric, self.enabled = total, metric, enabled
        self.better = max if direction == "maximize" else min
        self.finished_count = self.running = 0
        self.best: float | None = None
        self.started_at: dict[int, float] = {}
        self.bar: Any = None

    def __enter__(self) -> TrialDisplay:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[state]}"), TimeElapsedColumn())
            self.bar.start()
            self.task = self.bar.add_task("trials", total=self.total, state="")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self._refresh()
            self.bar.stop()

    def start(self, already_finished: int) -> None:
        self.finished_count = already_finished
        if already_finished:
            self._line(f"resuming: {already_finished} of {self.total} trials already finished")
        self._refresh()

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
            what = f"complete  {self.metric} {trial.value:.3f}"
        elif trial.state == TrialState.PRUNED:
            step = trial.user_attrs.get("pruned_at_step")
            value = trial.intermediate_values.get(step)
            shown = f" ({self.metric} {value:.3f})" if value is not None else ""
            what = f"pruned    at step {step}{shown}"
        else:
            what = f"failed    {trial.user_attrs.get('error', '')}"
        self._line(f"trial {trial.number:<4} {what}{took}")

    def note(self, text: str) -> None:
        self._line(text)

    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self._refresh()
        else:
            print(text, flush=True)

    def _refresh(self) -> None:
        if self.bar is not None:
            state = f"running {self.running}" + (f"  best {self.metric} {self.best:.3f}" if self.best is not None else "")
            self.bar.update(self.task, completed=min(self.finished_count, self.total), state=state)
