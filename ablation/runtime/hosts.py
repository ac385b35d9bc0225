"""Which driver holds a run: this driver's holder string, whether a holder's process is alive, and
giving back the runs a dead driver on this machine left running."""

from __future__ import annotations

import os
import socket

from dapo_ablate.ablation.store.ledger import RUNNING, Ledger


def release_orphans(ledger: Ledger, experiment: str, host: str) -> int:
    """Runs of `experiment` left *running* by a dead driver process on this machine go back to
    pending now; how many. ``host`` is this driver's `this_host()` ("hostname:pid"): runs held by
    a live process, this one included, or by another machine are left alone (a lease handles those)."""
    hostname, _, own_pid = host.rpartition(":")
    released = 0
    for row in ledger.runs_table(experiment):
        holder, _, pid = (row["host"] or "").rpartition(":")
        if row["status"] == RUNNING and holder == hostname and pid.isdigit():
            if int(pid) != int(own_pid) and not pid_alive(int(pid)):
                released += ledger.release(row["run_id"], host=row["host"])
    return released


def this_host() -> str:
    """The ledger's holder string of this driver: ``hostname/pidns-<id>:pid``. The PID namespace
    keeps containers that share a hostname (and a PostgreSQL ledger) from judging each other's
    pids: only a holder in this very namespace is checked for liveness."""
    return f"{socket.gethostname()}/pidns-{_pid_namespace()}:{os.getpid()}"


def _pid_namespace() -> str:
    try:
        return "".join(ch for ch in os.readlink("/proc/self/ns/pid") if ch.isdigit()) or "0"
    except OSError:  # no procfs (macOS): pids are the machine's
        return "0"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
