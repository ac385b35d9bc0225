"""A run's wall-clock limit and where it comes from (`executor.run_timeout_s`, or a backend's own:
a verl cell's from its GPU-hour estimate, `verl_plan.time_limit`), as the pool enforces it and as
its timeout error and ``validate`` name it."""

from __future__ import annotations

import math
from dataclasses import dataclass

RUN_TIMEOUT_S = "executor.run_timeout_s"


@dataclass(frozen=True)
class TimeLimit:
    """`seconds` of wall time from a run's start on a Ray worker (a Ray job: from its submission);
    None: no limit. `source` says where the number comes from."""

    seconds: float | None
    source: str = RUN_TIMEOUT_S

    def deadline(self, now: float) -> float:
        """The monotonic time past which the run is timed out, if its time started at `now`."""
        return now + self.seconds if self.seconds else math.inf

    def error(self) -> str:
        """The ledger's error of a run past it."""
        return f"TimeoutError: the run exceeded {self.source} ({self.seconds:g} s)"

    def describe(self) -> str:
        """``12.5 h (source)``, or that there is none."""
        if not self.seconds:
            return f"none ({self.source} null)"
        return f"{self.seconds / 3600:,.1f} h ({self.source})"
