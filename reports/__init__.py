"""dapo_ablate.reports: causal-isolation reports from a tidy results table.

Reads a pandas DataFrame (or a CSV) with one 0/1 column per factor, ``seed``, metric columns
and optional compute columns; imports nothing of dapo_ablate.ablation, and of dapo_ablate.core
only its dependency-free contracts (``core.contracts``: column names, technique labels).

    from dapo_ablate.reports import load_results_csv, write_report
    results, factors = load_results_csv("results.csv")
    write_report(results, factors, "report/")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analysis import Analysis, analyze
    from .options import FORMATS, ReportOptions
    from .report import write_report
    from .table import PAPER_AIME_AVG32, PAPER_FACTORS, ReportInputError, load_results_csv, validate_results

_HOMES = {
    "Analysis": "analysis",
    "analyze": "analysis",
    "FORMATS": "options",
    "ReportOptions": "options",
    "write_report": "report",
    "PAPER_AIME_AVG32": "table",
    "PAPER_FACTORS": "table",
    "ReportInputError": "table",
    "load_results_csv": "table",
    "validate_results": "table",
}
"""Where each public name lives. They load on first use, so that a module of this package (the
answer `run` and `status` print) does not load the figures' and the page's code (matplotlib)."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
