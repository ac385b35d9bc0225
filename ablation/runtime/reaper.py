"""Ray processes started by a driver do not outlive it.

`ray.init()` starts a local Ray as children of the driver (GCS, raylet, monitors); the raylet
starts agents and workers in turn. `ray.shutdown()` stops them when the driver exits normally,
but after a SIGKILL of the driver they are orphaned, and the dashboard and runtime-env agents
(about 200 MB) stay alive. A small watchdog process, started right after `ray.init()`, waits for
the driver to die and then kills the whole tree under the processes Ray started. Processes are
identified by (pid, start time), so a reused pid is never killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5


def _start_time(pid: int) -> int | None:
    """Kernel start time of `pid` (clock ticks since boot), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _children() -> dict[int, list[int]]:
    """ppid -> child pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, this process excluded, from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (a driver or `ray start --block` started in its own
    session, and the Ray processes it started)."""
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def descendants(roots: list[int]) -> list[int]:
    """Every process under `roots` (roots included), from /proc."""
    tree, found, stack = _children(), [], list(roots)
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(tree.get(pid, []))
    return found


def start_reaper() -> subprocess.Popen | None:
    """Watch this (driver) process; when it dies, kill the processes it has started so far (and
    everything under them). Call it right after a local `ray.init()`. None where /proc is
    missing (not Linux): there Ray's own clean-up is all there is."""
    if not os.path.isdir("/proc"):
        return None
    me = os.getpid()
    roots = [(pid, _start_time(pid)) for pid in descendants([me]) if pid != me]
    args = [sys.executable, "-m", "dapo_ablate.ablation.runtime.reaper", str(me), str(_start_time(me))]
    args += [f"{pid}:{start}" for pid, start in roots if start is not None]
    # its own session: a Ctrl-C in the terminal must not kill the watchdog before the driver
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _watch(driver: int, driver_start: int, roots: list[tuple[int, int]]) -> None:
    while _start_time(driver) == driver_start:
        time.sleep(POLL_S)
    live = [pid for pid, start in roots if _start_time(pid) == start]
    for pid in descendants(live):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]), [tuple(map(int, item.split(":"))) for item in sys.argv[3:]])
