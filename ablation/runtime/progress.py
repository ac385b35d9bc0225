"""What the user watches while runs or trials go: one line per event, printed above a rich
progress bar or alone. `run_display.RunDisplay` (runs) and `sweeps.display.TrialDisplay` (trials)
build on `EventLines`."""

from __future__ import annotations

from typing import Any


class EventLines:
    """With ``enabled``, a rich progress bar (the unit, done of total, the subclass's ``state``
    text, elapsed time, optionally an ETA) with each `note` printed above it; else plain lines.

    Subclasses open the bar in ``__enter__`` with `_start_bar` and fill it in `_refresh`."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def _start_bar(self, unit: str, total: int, completed: int = 0, eta: bool = False) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = [TextColumn(f"[bold]{unit}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[state]}"),
                   TimeElapsedColumn()]
        fields = {"state": ""}
        if eta:
            columns.append(TextColumn("{task.fields[eta]}"))
            fields["eta"] = ""
        self.bar = Progress(*columns)
        self.bar.start()
        self.task = self.bar.add_task(unit, total=total, completed=completed, **fields)

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self._refresh()
            self.bar.stop()

    def note(self, text: str) -> None:
        self._line(text)

    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self._refresh()
        else:
            print(text, flush=True)

    def _refresh(self) -> None:
        raise NotImplementedError
