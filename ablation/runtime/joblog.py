"""The tail of a Ray job's log, as a failure message quotes it."""

from __future__ import annotations

LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 1500


def log_tail(logs: str) -> str:
    """The last `LOG_TAIL_LINES` non-blank lines of a job's log joined by `` | ``, cut to their last
    `LOG_TAIL_CHARS` characters: one line, because the ledger keeps an error's first line, and
    its end, because that is where a traceback names the error."""
    lines = [line.strip() for line in logs.splitlines() if line.strip()][-LOG_TAIL_LINES:]
    tail = " | ".join(lines)
    return tail if len(tail) <= LOG_TAIL_CHARS else "..." + tail[-(LOG_TAIL_CHARS - 3):]
