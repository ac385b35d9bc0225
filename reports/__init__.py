"""dapo_ablate.reports: causal-isolation reports from a tidy results table.

Reads a pandas DataFrame (or a CSV) with one 0/1 column per factor, ``seed``, metric columns
and optional compute columns; imports nothing of dapo_ablate.ablation, and of dapo_ablate.core
only its dependency-free contracts (``core.contracts``: column names, technique labels).

    from dapo_ablate.reports import load_results_csv, write_report
    results, factors = load_results_csv("results.csv")
    write_report(results, factors, "report/")
"""

from .analysis import Analysis, analyze
from .options import FORMATS, ReportOptions
from .report import write_report
from .table import PAPER_AIME_AVG32, PAPER_FACTORS, ReportInputError, load_results_csv, validate_results

__all__ = [
    "Analysis",
    "FORMATS",
    "PAPER_AIME_AVG32",
    "PAPER_FACTORS",
    "ReportInputError",
    "ReportOptions",
    "analyze",
    "load_results_csv",
    "validate_results",
    "write_report",
]
