"""How a cell's Ray job ended when it did not succeed: a real failure (`JobFailed`: its entrypoint
exited non-zero, e.g. verl raised) or a loss (`JobLost`: a node died or was preempted under it, or
its supervisor actor died), which a verl run survives by resubmitting the job from its last
checkpoint (`registry.VerlBackend.retries`).

Ray's Job API says little: a job whose supervisor's node died ends FAILED with error type
``JOB_SUPERVISOR_ACTOR_DIED``; a job whose worker node died ends FAILED with verl's own non-zero
exit, so its log is read for Ray's node-loss errors (`LOST_MARKERS`); an entrypoint ended by SIGTERM
(a cloud's preemption notice) exits -15 or 143.
"""

from __future__ import annotations

LOST_ERROR_TYPES = ("JOB_SUPERVISOR_ACTOR_DIED",)
"""``JobInfo.error_type`` values of a job lost with its supervisor's node."""
LOST_EXIT_CODES = (-15, 143)
"""The entrypoint's exit codes of a SIGTERM (a preemption notice): the signal itself, or the shell's 128 + 15."""
LOST_MARKERS = ("NodeDiedError", "its node has died", "was dead or unavailable", "node was terminated", "preempted")
"""Ray's words, in a job's log, for an actor or task lost with its node (ray.exceptions: ActorDiedError's
node death, NodeDiedError; a node drained for preemption)."""


class JobFailed(RuntimeError):
    """A cell's Ray job ended FAILED or STOPPED; the message (one line) ends with its log tail."""


class JobLost(JobFailed):
    """A cell's Ray job was lost with a node (died, preempted) or its supervisor, not failed by its
    own code: a verl run resubmits it from its last checkpoint."""


REAL_FAILURE = f"{JobFailed.__name__}:"
"""How the ledger's error of a run whose job really failed begins (``describe_error``'s ``Type: message``)."""


def lost_reason(error_type: object, exit_code: int | None, logs: str) -> str | None:
    """Why a job that ended FAILED was lost rather than failed by its own code; None: a real failure.
    `error_type`: its ``JobInfo.error_type`` (an enum or its name; None), `exit_code`: its
    entrypoint's (None: unknown), `logs`: its log."""
    name = str(getattr(error_type, "value", error_type) or "")
    if name in LOST_ERROR_TYPES:
        return f"its supervisor died ({name})"
    if exit_code in LOST_EXIT_CODES:
        return f"its entrypoint was ended by SIGTERM (exit {exit_code}: a preemption)"
    found = next((marker for marker in LOST_MARKERS if marker.lower() in logs.lower()), None)
    return f"a node was lost under it (its log says {found!r})" if found else None
