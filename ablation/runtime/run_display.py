"""What the user watches while a factorial's runs go, as a `RunListener` of the one `Driver`: a
rich progress bar (done, running, failed, ETA) with one line per finished or failed run above it,
or just those lines."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dapo_ablate.ablation.runtime.driver import (
    DONE_ELSEWHERE,
    FAILED_ATTEMPT,
    LEASE_LOST,
    RECORDED,
    RunListener,
    RunRequest,
    Settled,
)
from dapo_ablate.ablation.runtime.progress import EventLines
from dapo_ablate.core.contracts import metric_text

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.design import Plan, PlannedRun


class RunDisplay(EventLines, RunListener):
    """The runs' bar and lines (``enabled=False``: just the lines); `planned` names the runs whose
    notes it shows (run id -> planned run, the scheduler's own mapping)."""

    def __init__(self, total: int, done: int, enabled: bool, metric: str = "",
                 planned: dict[str, PlannedRun] | None = None) -> None:
        super().__init__(enabled)
        self.total, self.n_done, self.metric, self.planned = total, done, metric, planned or {}
        self.running = self.n_failed = self.finished_now = 0
        self.started = time.monotonic()

    def __enter__(self) -> RunDisplay:
        if self.enabled:
            self._start_bar("runs", self.total, completed=self.n_done, eta=True)
            self._refresh()
        return self

    # -- the driver's events (RunListener) ------------------------------------------------------

    def run_submitted(self, request: RunRequest, accepted: bool, in_flight: int) -> None:
        self.update(running=in_flight)

    def event(self, run_id: str, kind: str, step: int, data: dict[str, Any]) -> None:
        if kind == "note" and run_id in self.planned:  # e.g. a checkpoint it would not trust
            self.note(f"{self.planned[run_id].name}: {data.get('message')}")

    def settled(self, settled: Settled | None, in_flight: int) -> None:
        if settled is not None:
            if settled.what == RECORDED:
                self.done(settled.name, settled.result or {}, self.metric)
            elif settled.what == FAILED_ATTEMPT:
                self.failed(settled.name, settled.error, settled.attempt, settled.retry)
            elif settled.what == DONE_ELSEWHERE:
                self.note(f"{settled.name}: already done by another driver")
            elif settled.what == LEASE_LOST:
                self.note(f"{settled.name}: lease lost to another driver; stopped here")
        self.update(running=in_flight)

    def grown(self, plan: Plan, added: int) -> None:
        self.grow(added)

    # -- the lines and the bar ------------------------------------------------------------------

    def update(self, running: int) -> None:
        self.running = running
        self._refresh()

    def done(self, name: str, result: dict[str, Any], metric: str) -> None:
        self.n_done += 1
        self.finished_now += 1
        value = (result.get("metrics") or {}).get(metric)
        shown = metric_text(value, metric)
        self._line(f"done    {name:<28} {shown}  {float(result.get('wall_s') or 0):.1f} s")

    def grow(self, runs: int) -> None:
        """An adaptive experiment's look added `runs` runs to the plan."""
        self.total += runs
        if self.bar is not None:
            self.bar.update(self.task, total=self.total)
        self._refresh()

    def failed(self, name: str, error: str, attempt: int, retry: bool) -> None:
        if not retry:
            self.n_failed += 1
        then = "retrying" if retry else "giving up for now"
        self._line(f"failed  {name:<28} attempt {attempt}, {then}: {error}")

    def eta(self) -> str:
        """Remaining runs at this invocation's throughput so far."""
        remaining = self.total - self.n_done - self.n_failed
        if self.finished_now == 0 or remaining <= 0:
            return "ETA -:--" if remaining > 0 else ""
        seconds = int(remaining * (time.monotonic() - self.started) / self.finished_now)
        return f"ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def _refresh(self) -> None:
        if self.bar is not None:
            state = f"done {self.n_done}  running {self.running}  failed {self.n_failed}"
            self.bar.update(self.task, completed=self.n_done, state=state, eta=self.eta())
